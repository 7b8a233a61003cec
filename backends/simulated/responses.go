package simulated

import (
	"container/list"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate-dev/tollgate/internal/bytesconv"
)

// The Responses API (POST /v1/responses), as vLLM serves it. The input is a string or a list of
// items; instructions and every message item count like chat messages (4 tokens each plus their
// words), function_call_output items their words, and a follow-up (previous_response_id) also
// counts the input and output of the response it continues. The output is one assistant message
// of generated text: max_output_tokens cuts it short (status "incomplete"), text.format
// json_schema / json_object makes it a JSON document. Function tools are chosen as in chat
// (tools.go; "after a tool result" means the input ends with a function_call_output), and a call
// is one function_call output item whose arguments stream as function_call_arguments deltas.
// Responses are kept in memory (bounded, oldest first out) unless store is false, for GET
// /v1/responses/{id}, DELETE, cancel and follow-ups; an unknown id is a 404 with vLLM's message.
// A background response is answered at once ("queued"), is "in_progress" until the simulated
// model would have finished (the time to first token plus a delay per token), and can be
// cancelled until then; cancelling a synchronous response is refused, as vLLM refuses it.
// Streamed, the events come in vLLM's and OpenAI's order with "event:" lines and sequence
// numbers, and no [DONE]; the last is response.completed, or response.incomplete when
// max_output_tokens cut the response short. Replies follow OpenAI's OpenAPI spec
// (openapi_test.go checks them against it).

// response is one generated response.
type response struct {
	id, msgID    string
	created      int64
	modelRaw     string
	instructions string // JSON: null or a string
	maxOutput    string // JSON: null or an integer
	previous     string // JSON: null or a string
	metadata     string // JSON object
	textFormat   string // JSON object, the request's text.format
	store        bool
	out          output
	input        int       // input tokens, with those of the conversation it continues
	seedKey      uint64    // seeds the generator: the hash of the input and instructions
	tools        string    // JSON array, the request's tools
	toolChoice   string    // JSON, the request's tool_choice
	call         *toolCall // the function call the response makes; out holds its arguments
	fcID         string    // the function_call item's id
	// background responses are answered at once and finish at readyAt, unless cancelled first.
	background bool
	readyAt    time.Time
	cancelled  atomic.Bool
	cached     int
}

func (r *response) status() string {
	if r.out.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

// statusAt is the status of a stored response at now: a background response is in progress
// until it is ready, or cancelled.
func (r *response) statusAt(now time.Time) string {
	switch {
	case r.cancelled.Load():
		return "cancelled"
	case r.background && now.Before(r.readyAt):
		return "in_progress"
	}
	return r.status()
}

// finished reports whether a status carries the output and usage.
func finished(status string) bool { return status == "completed" || status == "incomplete" }

// itemStatus is the status of the output message: "incomplete" when it was cut short.
func (r *response) itemStatus() string {
	if r.out.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

// responseStore keeps the most recent responses.
type responseStore struct {
	capacity int
	mu       sync.Mutex
	order    *list.List // of *response, most recent at the front
	index    map[string]*list.Element
}

func newResponseStore(capacity int) *responseStore {
	return &responseStore{capacity: capacity, order: list.New(), index: make(map[string]*list.Element)}
}

func (rs *responseStore) put(r *response) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.index[r.id] = rs.order.PushFront(r)
	if rs.order.Len() > rs.capacity {
		oldest := rs.order.Back()
		rs.order.Remove(oldest)
		delete(rs.index, oldest.Value.(*response).id)
	}
}

func (rs *responseStore) get(id string) *response {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if e, ok := rs.index[id]; ok {
		return e.Value.(*response)
	}
	return nil
}

func (rs *responseStore) remove(id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	e, ok := rs.index[id]
	if ok {
		rs.order.Remove(e)
		delete(rs.index, id)
	}
	return ok
}

func responseNotFound(id string) apiError {
	return apiError{
		status: fasthttp.StatusNotFound, typ: "invalid_request_error", param: "response_id",
		msg: "Response with id '" + id + "' not found.",
	}
}

// responseByID serves GET, DELETE and POST …/cancel on /v1/responses/{id}[/cancel].
func (s *Server) responseByID(ctx *fasthttp.RequestCtx, rest string) {
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case action == "" && (ctx.IsGet() || ctx.IsDelete()):
	case action == "cancel" && ctx.IsPost():
	case action == "" || action == "cancel":
		allow := "GET, DELETE"
		if action == "cancel" {
			allow = "POST"
		}
		writeDetail(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed", allow)
		return
	default:
		writeDetail(ctx, fasthttp.StatusNotFound, "Not Found", "")
		return
	}
	if s.inject(ctx) {
		return
	}
	r := s.responses.get(id)
	if r == nil {
		e := responseNotFound(id)
		writeError(ctx, e.status, shapeNested, e)
		return
	}
	switch {
	case action == "cancel" && !r.background:
		writeError(ctx, fasthttp.StatusBadRequest, shapeNested, apiError{
			typ: "invalid_request_error", param: "response_id", msg: "Cannot cancel a synchronous response.",
		})
	case action == "cancel":
		// A background response still running stops here; a finished one is answered as it is.
		if r.statusAt(time.Now()) == "in_progress" {
			r.cancelled.Store(true)
		}
		status := r.statusAt(time.Now())
		b := replyBuffer(ctx)
		b = appendResponse(b, r, status, finished(status))
		setJSON(ctx, b)
	case ctx.IsDelete():
		s.responses.remove(id)
		b := replyBuffer(ctx)
		b = append(b, `{"id":`...)
		b = appendJSONString(b, id)
		b = append(b, `,"object":"response","deleted":true}`...)
		setJSON(ctx, b)
	default:
		status := r.statusAt(time.Now())
		b := replyBuffer(ctx)
		b = appendResponse(b, r, status, finished(status))
		setJSON(ctx, b)
	}
}

// createResponse serves POST /v1/responses.
func (s *Server) createResponse(ctx *fasthttp.RequestCtx) {
	if !s.admit(ctx) {
		return
	}
	r, stream, maxTokens, sp, e := s.parseResponse(ctx.PostBody())
	if e.status != 0 {
		s.refuse(ctx, e)
		return
	}
	seq := s.seq.Add(1)
	r.id, r.msgID = "resp_"+hexID(seq, 1), "msg_"+hexID(seq, 2)
	r.created = time.Now().Unix()
	limit, limitFinish := sp.limit(maxTokens, s.opts.Tokens, r.input)
	if r.call != nil {
		// A call: its arguments, which max_output_tokens can cut short into text, as a tool
		// parser would hand them back.
		callLimit := maxTokens
		if callLimit == 0 {
			callLimit = max(maxModelLen-r.input, 1)
		}
		src := documentSource(string(r.out.text))
		r.out = generate(&src, callLimit, "length", &stopRules{})
		if r.out.finish == "length" {
			r.call = nil
		} else {
			r.call.id, r.fcID = "call_"+hexID(seq, 3), "fc_"+hexID(seq, 4)
		}
	} else {
		rg := rng{state: r.seedKey}
		src := sp.source(&rg)
		r.out = generate(&src, limit, limitFinish, &sp.stops)
	}
	if r.background && !stream {
		// Answered at once; the response is ready when the simulated model would have finished.
		r.readyAt = time.Now().Add(s.opts.TimeToFirstToken + time.Duration(r.out.tokens())*s.opts.InterTokenDelay)
	}
	if r.store {
		s.responses.put(r)
	}
	if r.background && !stream {
		b := replyBuffer(ctx)
		b = appendResponse(b, r, "queued", false)
		setJSON(ctx, b)
		s.completed.Add(1)
		return
	}
	if !stream {
		s.waitFirstToken()
		b := replyBuffer(ctx)
		b = appendResponse(b, r, r.status(), true)
		setJSON(ctx, b)
		s.completed.Add(1)
		return
	}
	failAfter, breakAfter, ok := s.streamInjections(ctx)
	if !ok {
		return
	}
	startStream(ctx, newEventStream(s, &responseEvents{r: r}, failAfter, breakAfter), breakAfter)
}

// lastInputIsToolResult reports whether the input ends with a function call's output.
func lastInputIsToolResult(input gjson.Result) bool {
	items := input.Array()
	return input.IsArray() && len(items) > 0 && items[len(items)-1].Get("type").Str == "function_call_output"
}

// lastUserInput is the text of the last user message of the input.
func lastUserInput(input gjson.Result) string {
	if input.Type == gjson.String {
		return input.Str
	}
	items := input.Array()
	for i := len(items) - 1; i >= 0; i-- {
		if items[i].Get("role").Str == "user" {
			return messageText(items[i].Get("content"))
		}
	}
	return ""
}

// hexID is 32 hex digits unique to (seq, salt).
func hexID(seq int64, salt uint64) string {
	r := rng{state: mix(uint64(seq), salt)}
	b := make([]byte, 0, 32)
	for range 2 {
		v := r.next()
		for i := 60; i >= 0; i -= 4 {
			b = append(b, "0123456789abcdef"[(v>>uint(i))&0xf])
		}
	}
	return string(b)
}

// parseResponse reads a Responses API request. Every string kept in r is a copy, because a
// streamed response outlives the request body.
func (s *Server) parseResponse(body []byte) (r *response, stream bool, maxTokens int, sp sampling, e apiError) {
	js := bytesconv.String(body)
	if !gjson.Valid(js) {
		return nil, false, 0, sp, badRequest("", "The request body is not valid JSON.")
	}
	root := gjson.Parse(js)
	if !root.IsObject() {
		return nil, false, 0, sp, badRequest("", "The request body must be a JSON object.")
	}
	s.vary(&sp)
	r = &response{instructions: "null", maxOutput: "null", previous: "null", metadata: "{}",
		textFormat: `{"format":{"type":"text"}}`, store: true, tools: "[]", toolChoice: `"auto"`}
	if e = s.checkModel(root.Get("model"), &r.modelRaw); e.status != 0 {
		return nil, false, 0, sp, e
	}
	input := root.Get("input")
	switch {
	case input.Type == gjson.String:
		r.input = tokensPerMessage + countWords(input.Str)
	case input.IsArray():
		for _, item := range input.Array() {
			if !item.IsObject() {
				return nil, false, 0, sp, badRequest("input", "Each input item must be an object.")
			}
			switch item.Get("type").Str {
			case "", "message":
				r.input += tokensPerMessage + countWords(messageText(item.Get("content")))
			case "function_call_output":
				r.input += countWords(item.Get("output").String())
			case "function_call":
				r.input += countWords(item.Get("arguments").Str)
			}
		}
	default:
		return nil, false, 0, sp, badRequest("input", "input must be a string or an array of input items.")
	}
	if in := root.Get("instructions"); in.Type == gjson.String {
		r.instructions = in.Raw
		r.input += tokensPerMessage + countWords(in.Str)
	}
	if m := root.Get("max_output_tokens"); m.Exists() && m.Type != gjson.Null {
		n, ok := positiveInt(m, maxModelLen)
		if !ok {
			return nil, false, 0, sp, badRequest("max_output_tokens", "max_output_tokens must be an integer greater than or equal to 1.")
		}
		maxTokens, r.maxOutput = n, strconv.Itoa(n)
	}
	if p := root.Get("previous_response_id"); p.Type == gjson.String {
		prev := s.responses.get(p.Str)
		if prev == nil {
			return nil, false, 0, sp, responseNotFound(p.Str)
		}
		r.previous = p.Raw
		r.input += prev.input + prev.out.tokens()
	}
	if m := root.Get("metadata"); m.IsObject() {
		r.metadata = m.Raw
	}
	r.store = root.Get("store").Type != gjson.False
	r.background = root.Get("background").Type == gjson.True
	if r.background && !r.store {
		return nil, false, 0, sp, badRequest("background", "background can only be used when `store` is true")
	}
	stream = root.Get("stream").Type == gjson.True
	if f := root.Get("text.format"); f.IsObject() {
		r.textFormat = `{"format":` + f.Raw + `}`
		switch f.Get("type").Str {
		case "json_object":
			sp.format = outputFormat{kind: formatJSONObject}
		case "json_schema":
			if schema := f.Get("schema"); schema.IsObject() {
				sp.format = outputFormat{kind: formatJSONSchema, schema: schema}
			} else {
				sp.format = outputFormat{kind: formatJSONObject}
			}
		}
	}
	r.seedKey = sp.base(input.Raw + r.instructions)
	if t := root.Get("tools"); t.IsArray() {
		r.tools = echoTools(t)
	}
	if c := root.Get("tool_choice"); c.Exists() && c.Type != gjson.Null {
		r.toolChoice = c.Raw
	}
	if tools, choice := root.Get("tools"), root.Get("tool_choice"); tools.Exists() || choice.Exists() {
		tr, te := parseTools(tools, choice, true)
		if te.status != 0 {
			return nil, false, 0, sp, te
		}
		if call := tr.choose(lastInputIsToolResult(input), lastUserInput(input)); call >= 0 {
			// The arguments are generated here, while the schema in the body is still valid.
			rg := rng{state: r.seedKey}
			r.call = &toolCall{name: strings.Clone(tr.tools[call].name)}
			r.out.text = []byte(toolArguments(tr.tools[call].parameters, &rg))
		}
	}
	// Copies of what points into the body; the schema is used before the handler returns.
	r.instructions, r.previous, r.metadata = strings.Clone(r.instructions), strings.Clone(r.previous), strings.Clone(r.metadata)
	r.textFormat, r.modelRaw = strings.Clone(r.textFormat), strings.Clone(r.modelRaw)
	r.toolChoice = strings.Clone(r.toolChoice)
	if r.input+max(maxTokens, 1) > maxModelLen {
		return nil, false, 0, sp, badRequest("input", "This model's maximum context length is "+strconv.Itoa(maxModelLen)+" tokens.")
	}
	return r, stream, maxTokens, sp, apiError{}
}

// echoTools is the request's tools as the response echoes them: a function tool with each of
// name, description, parameters and strict, null when the request left it out (OpenAI's spec
// requires them, and vLLM echoes the tools it parsed, each member present); any other tool as it
// came.
func echoTools(tools gjson.Result) string {
	b := []byte{'['}
	for i, t := range tools.Array() {
		if i > 0 {
			b = append(b, ',')
		}
		if t.Get("type").Str != "function" {
			b = append(b, t.Raw...)
			continue
		}
		b = append(b, `{"type":"function","name":`...)
		b = appendRawOrNull(b, t.Get("name"))
		b = append(b, `,"description":`...)
		b = appendRawOrNull(b, t.Get("description"))
		b = append(b, `,"parameters":`...)
		b = appendRawOrNull(b, t.Get("parameters"))
		b = append(b, `,"strict":`...)
		b = appendRawOrNull(b, t.Get("strict"))
		b = append(b, '}')
	}
	return string(append(b, ']'))
}

// appendRawOrNull appends the JSON of v, or null when it is absent.
func appendRawOrNull(b []byte, v gjson.Result) []byte {
	if !v.Exists() {
		return append(b, "null"...)
	}
	return append(b, v.Raw...)
}

// appendResponse appends the response object with the given status; without output it has an
// empty output list and no usage, as in response.created. Members OpenAI's spec types without
// null (usage, user) are left out rather than sent as null.
func appendResponse(b []byte, r *response, status string, withOutput bool) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, r.id...)
	b = append(b, `","object":"response","created_at":`...)
	b = strconv.AppendInt(b, r.created, 10)
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","background":`...)
	b = strconv.AppendBool(b, r.background)
	b = append(b, `,"error":null,"incomplete_details":`...)
	if withOutput && status == "incomplete" {
		b = append(b, `{"reason":"max_output_tokens"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"instructions":`...)
	b = append(b, r.instructions...)
	b = append(b, `,"max_output_tokens":`...)
	b = append(b, r.maxOutput...)
	b = append(b, `,"max_tool_calls":null,"model":`...)
	b = append(b, r.modelRaw...)
	b = append(b, `,"output":[`...)
	if withOutput {
		b = appendOutputItem(b, r, r.itemStatus())
	}
	b = append(b, `],"parallel_tool_calls":true,"previous_response_id":`...)
	b = append(b, r.previous...)
	b = append(b, `,"reasoning":null,"service_tier":"auto","store":`...)
	b = strconv.AppendBool(b, r.store)
	b = append(b, `,"temperature":1.0,"text":`...)
	b = append(b, r.textFormat...)
	b = append(b, `,"tool_choice":`...)
	b = append(b, r.toolChoice...)
	b = append(b, `,"tools":`...)
	b = append(b, r.tools...)
	b = append(b, `,"top_logprobs":0,"top_p":1.0,"truncation":"disabled"`...)
	if withOutput {
		// A prefix cache only reads, so nothing is ever written to it: cache_write_tokens is 0.
		b = append(b, `,"usage":{"input_tokens":`...)
		b = strconv.AppendInt(b, int64(r.input), 10)
		b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(r.cached), 10)
		b = append(b, `,"cache_write_tokens":0},"output_tokens":`...)
		b = strconv.AppendInt(b, int64(r.out.tokens()), 10)
		b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		b = strconv.AppendInt(b, int64(r.input+r.out.tokens()), 10)
		b = append(b, '}')
	}
	b = append(b, `,"metadata":`...)
	b = append(b, r.metadata...)
	return append(b, '}')
}

// appendOutputItem appends the response's output item: the function call, or the message.
func appendOutputItem(b []byte, r *response, status string) []byte {
	if r.call == nil {
		return appendMessageItem(b, r, status)
	}
	b = append(b, `{"type":"function_call","id":"`...)
	b = append(b, r.fcID...)
	b = append(b, `","call_id":"`...)
	b = append(b, r.call.id...)
	b = append(b, `","name":`...)
	b = appendJSONString(b, r.call.name)
	b = append(b, `,"arguments":`...)
	if status == "in_progress" {
		b = append(b, `""`...)
	} else {
		b = appendJSONString(b, bytesconv.String(r.out.text))
	}
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	return append(b, `"}`...)
}

// appendMessageItem appends the output message item; in progress it has no content yet.
func appendMessageItem(b []byte, r *response, status string) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, r.msgID...)
	b = append(b, `","type":"message","status":"`...)
	b = append(b, status...)
	b = append(b, `","role":"assistant","content":[`...)
	if status != "in_progress" {
		b = appendOutputText(b, r.out.text)
	}
	return append(b, "]}"...)
}

func appendOutputText(b []byte, text []byte) []byte {
	b = append(b, `{"type":"output_text","text":`...)
	b = appendJSONString(b, bytesconv.String(text))
	return append(b, `,"annotations":[],"logprobs":[]}`...)
}

// Phases of a streamed response.
const (
	respCreated = iota
	respInProgress
	respItemAdded
	respPartAdded
	respDeltas
	respTextDone
	respPartDone
	respItemDone
	respCompleted
	respEnd
)

// responseEvents renders a streamed response.
type responseEvents struct {
	r     *response
	phase int
	seq   int // sequence_number of the next event
	tok   int
}

func (re *responseEvents) event(b []byte, typ string) []byte {
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: {\"type\":\""...)
	b = append(b, typ...)
	b = append(b, `","sequence_number":`...)
	b = strconv.AppendInt(b, int64(re.seq), 10)
	re.seq++
	return b
}

// itemRef appends the item a function call event is about.
func (re *responseEvents) itemRef(b []byte) []byte {
	b = append(b, `,"item_id":"`...)
	b = append(b, re.r.fcID...)
	return append(b, `","output_index":0`...)
}

// partRef appends the item and content indexes a part event carries.
func (re *responseEvents) partRef(b []byte) []byte {
	b = append(b, `,"item_id":"`...)
	b = append(b, re.r.msgID...)
	return append(b, `","output_index":0,"content_index":0`...)
}

func (re *responseEvents) next(b []byte) ([]byte, eventKind, bool) {
	r := re.r
	kind := eventHead
	switch re.phase {
	case respCreated, respInProgress:
		typ := "response.created"
		if re.phase == respInProgress {
			typ = "response.in_progress"
		}
		b = re.event(b, typ)
		b = append(b, `,"response":`...)
		b = appendResponse(b, r, "in_progress", false)
		re.phase++
	case respItemAdded:
		b = re.event(b, "response.output_item.added")
		b = append(b, `,"output_index":0,"item":`...)
		b = appendOutputItem(b, r, "in_progress")
		re.phase++
		if r.call != nil {
			// A call has no content part: its arguments stream, then the item is done.
			re.phase = respDeltas
			if r.out.tokens() == 0 {
				re.phase = respTextDone
			}
		}
	case respPartAdded:
		b = re.event(b, "response.content_part.added")
		b = re.partRef(b)
		b = append(b, `,"part":`...)
		b = appendOutputText(b, nil)
		re.phase = respDeltas
		if r.out.tokens() == 0 {
			re.phase = respTextDone
		}
	case respDeltas:
		if r.call != nil {
			b = re.event(b, "response.function_call_arguments.delta")
			b = re.itemRef(b)
			b = append(b, `,"delta":`...)
			b = appendJSONString(b, bytesconv.String(r.out.piece(re.tok)))
		} else {
			b = re.event(b, "response.output_text.delta")
			b = re.partRef(b)
			b = append(b, `,"delta":`...)
			b = appendJSONString(b, bytesconv.String(r.out.piece(re.tok)))
			b = append(b, `,"logprobs":[]`...)
		}
		kind = eventStep
		if re.tok++; re.tok == r.out.tokens() {
			re.phase = respTextDone
		}
	case respTextDone:
		if r.call != nil {
			b = re.event(b, "response.function_call_arguments.done")
			b = re.itemRef(b)
			b = append(b, `,"name":`...)
			b = appendJSONString(b, r.call.name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, bytesconv.String(r.out.text))
			kind = eventTail
			re.phase = respItemDone
			break
		}
		b = re.event(b, "response.output_text.done")
		b = re.partRef(b)
		b = append(b, `,"text":`...)
		b = appendJSONString(b, bytesconv.String(r.out.text))
		b = append(b, `,"logprobs":[]`...)
		kind = eventTail
		re.phase++
	case respPartDone:
		b = re.event(b, "response.content_part.done")
		b = re.partRef(b)
		b = append(b, `,"part":`...)
		b = appendOutputText(b, r.out.text)
		kind = eventTail
		re.phase++
	case respItemDone:
		b = re.event(b, "response.output_item.done")
		b = append(b, `,"output_index":0,"item":`...)
		b = appendOutputItem(b, r, r.itemStatus())
		kind = eventTail
		re.phase++
	case respCompleted:
		// The last event is named after the status: OpenAI ends a response cut short with
		// response.incomplete (vLLM sends response.completed whatever the status inside).
		typ := "response.completed"
		if r.status() == "incomplete" {
			typ = "response.incomplete"
		}
		b = re.event(b, typ)
		b = append(b, `,"response":`...)
		b = appendResponse(b, r, r.status(), true)
		kind = eventTail
		re.phase++
	default:
		return b, 0, false
	}
	return append(b, "}\n\n"...), kind, true
}

func (re *responseEvents) fail(b []byte) []byte {
	b = append(b, "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"simulated mid-stream failure\",\"param\":null,\"sequence_number\":"...)
	b = strconv.AppendInt(b, int64(re.seq), 10)
	return append(b, `,"error":{"message":"simulated mid-stream failure","type":"InternalServerError","code":500}}`+"\n\n"...)
}

// done adds nothing: a Responses stream ends after its last event, without [DONE].
func (re *responseEvents) done(b []byte) []byte { return b }
