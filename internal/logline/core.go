package logline

import (
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Fields is a zap.Inline marshaler that can also append its fields as zap's
// JSON encoder would: the members "key":value of the object, separated by
// commas, exactly as MarshalLogObject has the encoder write them. It
// returns false when it cannot, and the line is then zap's.
type Fields interface {
	zapcore.ObjectMarshaler
	AppendJSONFields(dst []byte) ([]byte, bool)
}

// EncoderConfig is the encoder config the gateway logs with: zap's
// production config with ISO 8601 times. The JSON core writes its lines.
func EncoderConfig() zapcore.EncoderConfig {
	cfg := zap.NewProductionEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg
}

// maxPooled is the largest line buffer kept for reuse, so that one huge
// line (a long error) does not stay allocated.
const maxPooled = 16 << 10

// jsonCore is a JSON ioCore on EncoderConfig that writes the lines whose
// only field is a Fields itself, and leaves every other line to the
// ioCore. Its lines are the ioCore's byte for byte (TestCoreMatchesZap).
type jsonCore struct {
	zapcore.Core // the ioCore: levels, context fields and the lines not written here
	out          zapcore.WriteSyncer
	bufs         sync.Pool // *[]byte
}

var _ zapcore.Core = (*jsonCore)(nil)

// NewJSONCore returns a core writing JSON lines on EncoderConfig to out at
// the levels enab enables, as zapcore.NewCore(zapcore.NewJSONEncoder(
// EncoderConfig()), out, enab) would, writing the lines of one Fields
// field without zap's encoder.
func NewJSONCore(out zapcore.WriteSyncer, enab zapcore.LevelEnabler) zapcore.Core {
	return &jsonCore{Core: zapcore.NewCore(zapcore.NewJSONEncoder(EncoderConfig()), out, enab), out: out}
}

// Level reports the wrapped core's minimum level, for zapcore.LevelOf.
func (c *jsonCore) Level() zapcore.Level { return zapcore.LevelOf(c.Core) }

// With returns the wrapped core with the fields: lines with context fields
// are zap's.
func (c *jsonCore) With(fields []zapcore.Field) zapcore.Core { return c.Core.With(fields) }

// Check adds c, not the wrapped core, for the levels the wrapped core
// enables, as the ioCore's Check does for itself, so that Write comes here.
func (c *jsonCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *jsonCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if len(fields) == 1 && fields[0].Type == zapcore.InlineMarshalerType {
		if f, ok := fields[0].Interface.(Fields); ok {
			bp, _ := c.bufs.Get().(*[]byte)
			if bp == nil {
				bp = new([]byte)
			}
			line, ok := appendLine((*bp)[:0], ent, f)
			var err error
			if ok {
				_, err = c.out.Write(line)
			}
			if cap(line) <= maxPooled {
				*bp = line
				c.bufs.Put(bp)
			}
			if ok {
				return err
			}
		}
	}
	return c.Core.Write(ent, fields)
}

// appendLine appends the line of ent with the fields f as the JSON encoder
// on EncoderConfig writes it, or reports false for an entry whose line
// holds more than level, ts and msg (a logger name, a caller, a stack),
// has no time, or is at a level whose Write also syncs (above error).
func appendLine(dst []byte, ent zapcore.Entry, f Fields) ([]byte, bool) {
	var level string
	switch ent.Level {
	case zapcore.DebugLevel:
		level = `{"level":"debug","ts":"`
	case zapcore.InfoLevel:
		level = `{"level":"info","ts":"`
	case zapcore.WarnLevel:
		level = `{"level":"warn","ts":"`
	case zapcore.ErrorLevel:
		level = `{"level":"error","ts":"`
	default:
		return dst, false
	}
	if ent.LoggerName != "" || ent.Caller.Defined || ent.Stack != "" || ent.Time.IsZero() {
		return dst, false
	}
	dst = append(dst, level...)
	dst = appendTime(dst, ent.Time)
	dst = append(dst, `","msg":`...)
	dst = AppendString(dst, ent.Message)
	dst = append(dst, ',')
	n := len(dst)
	dst, ok := f.AppendJSONFields(dst)
	if !ok {
		return dst, false
	}
	if len(dst) == n {
		dst = dst[:n-1] // no fields, no separator
	}
	return append(dst, '}', '\n'), true
}
