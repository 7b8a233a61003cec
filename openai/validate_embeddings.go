package openai

// Embedding field indexes in embeddingFields.
const (
	emModel = iota
	emInput
	emEncodingFormat
	emDimensions
	emUser
	emPriority
	emFirstPlain // fields from here on are only type-checked
)

// embeddingFields are the fields of POST /v1/embeddings (OpenAI's, with
// vLLM's extras) that the gateway checks.
var embeddingFields = []field{
	emModel:          chatFields[fModel],
	emInput:          newField("input", kindSpecial, notNull),
	emEncodingFormat: newField("encoding_format", kindSpecial, orNull),
	emDimensions:     intField("dimensions", orNull, 1, "an integer of at least 1, or null"),
	emUser:           chatFields[fUser],
	emPriority:       chatFields[fPriority],
	emFirstPlain:     chatFields[fTruncatePromptTokens],
	emFirstPlain + 1: chatFields[fAddSpecialTokens],
	emFirstPlain + 2: chatFields[fRequestID],
}

// ValidateEmbeddings checks a POST /v1/embeddings body and fills req:
// the model and its offsets, and the size of the input. Embeddings are
// never streamed.
func ValidateEmbeddings(body []byte, req *Request, lim BodyLimits) *ValidationError {
	var v validator
	first, verr := v.start(body, req, BodyLimits{MaxDepth: lim.MaxDepth}, `The request body is empty; send a JSON object with an "input".`)
	if verr != nil {
		return verr
	}
	seen, verr := v.walkFields(first, embeddingFields, func(i int, val value, n int64) *ValidationError {
		switch i {
		case emModel:
			v.record(fModel, val, n)
		case emInput:
			return v.promptInput("input", val)
		case emEncodingFormat:
			switch unquoteIfString(val) {
			case "float", "base64":
				return nil
			}
			if val.isNull() {
				return nil
			}
			return typeError("encoding_format", `"float", "base64" or null`, val)
		case emPriority:
			req.Priority = n
		}
		return nil
	})
	if verr != nil {
		return verr
	}
	if seen&(1<<emInput) == 0 {
		return &ValidationError{Param: "input", Message: "input is required: a string, an array of strings, an array of token ids or an array of arrays of token ids."}
	}
	return nil
}
