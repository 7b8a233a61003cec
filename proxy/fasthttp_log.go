package proxy

import (
	"fmt"
	"regexp"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/openai"
)

// fasthttpLogger is fasthttp's Logger, writing to the gateway's zap logger
// instead of fasthttp's default (the standard library's, on stderr), with
// every quoted value redacted. fasthttp formats what it could not parse
// with %q — a header value with a control byte, a request line — and an
// Authorization value is the header most likely to be quoted, key and all,
// whatever SecureErrorLogMessage says. Its messages are the serving
// connection's errors, so they are warnings.
// The proxy's own server also redacts its configuration's secrets by value
// (see secretValues).
type fasthttpLogger struct {
	log *zap.Logger
	// server is the proxy whose secrets are redacted; nil for other
	// servers, which redact by shape only.
	server *Server
}

func (l fasthttpLogger) Printf(format string, args ...any) {
	if ce := l.log.Check(zap.WarnLevel, "http server"); ce != nil {
		msg := fmt.Sprintf(format, args...)
		if l.server != nil {
			msg = l.server.state.Load().secrets.redact(msg)
		}
		ce.Write(zap.String("error", redactSecrets(msg)))
	}
}

// quotedValue is a Go-quoted string, as %q writes it.
var quotedValue = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// redactSecrets replaces every quoted value and every credential-looking
// token in s. It is for text the gateway did not compose itself, and runs
// only on error paths.
func redactSecrets(s string) string {
	return openai.RedactCredentials(quotedValue.ReplaceAllLiteralString(s, `"[redacted]"`))
}

// NewFasthttpLogger is fasthttp's Logger for any other fasthttp server of
// the gateway (admin_listen): its lines go to log, redacted.
func NewFasthttpLogger(log *zap.Logger) fasthttp.Logger { return fasthttpLogger{log: log} }
