package simulated

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// Embeddings (POST /v1/embeddings). Each input (a string, an array of strings, an array of token
// ids, or an array of such arrays) gets a deterministic unit vector: component j is drawn from a
// generator seeded by the hash of the input's text and j, and the vector is normalised. So the
// same input always embeds the same way, and the first k components of a longer vector,
// normalised, are the vector of dimension k (as with Matryoshka embeddings). The dimension is
// Options.EmbeddingDimensions unless the request's "dimensions" asks for another.
// encoding_format "base64" sends the little-endian float32 bytes in base64, as OpenAI does.
// Usage counts the prompt tokens like text completions do.

// maxEmbeddingDimensions bounds the dimensions a request may ask for.
const maxEmbeddingDimensions = 65536

func (s *Server) embeddings(ctx *fasthttp.RequestCtx) {
	if !s.admit(ctx) {
		return
	}
	inputs, dims, base64Format, modelRaw, e := s.parseEmbeddings(ctx.PostBody())
	if e.status != 0 {
		s.refuse(ctx, e)
		return
	}
	s.waitFirstToken()
	id := s.seq.Add(1)
	b := replyBuffer(ctx)
	b = append(b, `{"id":"embd-`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `","object":"list","created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = append(b, modelRaw...)
	b = append(b, `,"data":[`...)
	vec := make([]float32, dims)
	tokens := 0
	for i, in := range inputs {
		tokens += in.tokens
		embed(vec, in.text)
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"object":"embedding","embedding":`...)
		if base64Format {
			b = appendBase64Vector(b, vec)
		} else {
			b = appendFloatVector(b, vec)
		}
		b = append(b, '}')
	}
	b = append(b, `],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(tokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(tokens), 10)
	b = append(b, `,"completion_tokens":0,"prompt_tokens_details":null}}`...)
	setJSON(ctx, b)
	s.completed.Add(1)
}

func (s *Server) parseEmbeddings(body []byte) (inputs []completionPrompt, dims int, base64Format bool, modelRaw string, e apiError) {
	js := bytesconv.String(body)
	if !gjson.Valid(js) {
		return nil, 0, false, "", badRequest("", "The request body is not valid JSON.")
	}
	root := gjson.Parse(js)
	if !root.IsObject() {
		return nil, 0, false, "", badRequest("", "The request body must be a JSON object.")
	}
	dims = s.opts.EmbeddingDimensions
	input := root.Get("input")
	if !input.Exists() {
		return nil, 0, false, "", badRequest("input", "Field required: input.")
	}
	var ok bool
	if inputs, ok = parsePrompts(input); !ok {
		return nil, 0, false, "", badRequest("input", "input must be a string, an array of strings, an array of token ids, or an array of arrays of token ids, and not empty.")
	}
	if len(inputs) > 2048 {
		return nil, 0, false, "", badRequest("input", "input must have at most 2048 items.")
	}
	switch f := root.Get("encoding_format"); {
	case !f.Exists() || f.Type == gjson.Null || f.Str == "float":
	case f.Str == "base64":
		base64Format = true
	default:
		return nil, 0, false, "", badRequest("encoding_format", "encoding_format must be float or base64.")
	}
	if d := root.Get("dimensions"); d.Exists() && d.Type != gjson.Null {
		n, ok := positiveInt(d, maxEmbeddingDimensions)
		if !ok {
			return nil, 0, false, "", badRequest("dimensions", "dimensions must be an integer from 1 to "+strconv.Itoa(maxEmbeddingDimensions)+".")
		}
		dims = n
	}
	e = s.checkModel(root.Get("model"), &modelRaw)
	return inputs, dims, base64Format, modelRaw, e
}

// embed fills v with the unit vector of text.
func embed(v []float32, text string) {
	h := fnv64(fnvOffset, text)
	var sum float64
	for j := range v {
		r := rng{state: mix(h, uint64(j))}
		x := float64(r.next()>>11)/(1<<53)*2 - 1 // uniform in [-1, 1)
		v[j] = float32(x)
		sum += x * x
	}
	norm := math.Sqrt(sum)
	if norm == 0 {
		v[0], norm = 1, 1
	}
	for j := range v {
		v[j] = float32(float64(v[j]) / norm)
	}
}

func appendFloatVector(b []byte, v []float32) []byte {
	b = append(b, '[')
	for j, x := range v {
		if j > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(x), 'g', -1, 32)
	}
	return append(b, ']')
}

func appendBase64Vector(b []byte, v []float32) []byte {
	raw := make([]byte, 4*len(v))
	for j, x := range v {
		binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, raw)
	return append(b, '"')
}
