package proxy

import (
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
	"github.com/tollgate-dev/tollgate/internal/logline"
)

// requestLog is the log line of a finished request, the fields of its
// record, logged with zap.Inline: the encoder is handed the fields
// directly, instead of thirteen zap.Fields built, copied and walked for
// every request. The line is the same (TestRequestLogLine). It is also a
// logline.Fields, so that the gateway's JSON core writes it without zap's
// encoder (TestRequestLogFastLine).
type requestLog struct{ rec *accounting.Record }

// The gateway's JSON core writes the line itself only for a logline.Fields.
var _ logline.Fields = requestLog{}

func (l requestLog) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	r := l.rec
	enc.AddString("request_id", r.RequestID)
	enc.AddString("endpoint", r.Endpoint)
	enc.AddString("model", r.Model)
	enc.AddString("backend", r.Backend)
	enc.AddInt("status", r.Status)
	enc.AddDuration("duration", r.Ended.Sub(r.Started))
	enc.AddString("key", r.KeyName)
	enc.AddString("team", r.Team)
	enc.AddString("project", r.Project)
	enc.AddBool("stream", r.Stream)
	enc.AddInt64("prompt_tokens", r.PromptTokens)
	enc.AddInt64("completion_tokens", r.CompletionTokens)
	enc.AddString("error", r.Error)
	return nil
}

// AppendJSONFields appends the fields MarshalLogObject writes, as zap's
// JSON encoder on the gateway's config writes them. It always can.
func (l requestLog) AppendJSONFields(dst []byte) ([]byte, bool) {
	r := l.rec
	dst = append(dst, `"request_id":`...)
	dst = logline.AppendString(dst, r.RequestID)
	dst = append(dst, `,"endpoint":`...)
	dst = logline.AppendString(dst, r.Endpoint)
	dst = append(dst, `,"model":`...)
	dst = logline.AppendString(dst, r.Model)
	dst = append(dst, `,"backend":`...)
	dst = logline.AppendString(dst, r.Backend)
	dst = append(dst, `,"status":`...)
	dst = logline.AppendInt(dst, int64(r.Status))
	dst = append(dst, `,"duration":`...)
	dst = logline.AppendSeconds(dst, r.Ended.Sub(r.Started))
	dst = append(dst, `,"key":`...)
	dst = logline.AppendString(dst, r.KeyName)
	dst = append(dst, `,"team":`...)
	dst = logline.AppendString(dst, r.Team)
	dst = append(dst, `,"project":`...)
	dst = logline.AppendString(dst, r.Project)
	dst = append(dst, `,"stream":`...)
	dst = logline.AppendBool(dst, r.Stream)
	dst = append(dst, `,"prompt_tokens":`...)
	dst = logline.AppendInt(dst, r.PromptTokens)
	dst = append(dst, `,"completion_tokens":`...)
	dst = logline.AppendInt(dst, r.CompletionTokens)
	dst = append(dst, `,"error":`...)
	return logline.AppendString(dst, r.Error), true
}
