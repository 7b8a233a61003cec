package proxy

import (
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/accounting"
)

// requestLog is the log line of a finished request, the fields of its
// record, logged with zap.Inline: the encoder is handed the fields
// directly, instead of thirteen zap.Fields built, copied and walked for
// every request. The line is the same (TestRequestLogLine).
type requestLog struct{ rec *accounting.Record }

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
