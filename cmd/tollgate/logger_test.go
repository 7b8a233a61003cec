package main

import (
	"bytes"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate-dev/tollgate/config"
	"github.com/tollgate-dev/tollgate/internal/logline"
)

// lineFields is a logline.Fields, as proxy's request line is.
type lineFields struct{ s string }

func (f lineFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("s", f.s)
	return nil
}

func (f lineFields) AppendJSONFields(dst []byte) ([]byte, bool) {
	return logline.AppendString(append(dst, `"s":`...), f.s), true
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                       { return c.t }
func (fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// TestNewLoggerLines checks that newLogger writes, in each format, the
// lines of the zap core it is meant to be: production encoder config, ISO
// 8601 times, capital levels on the console. The JSON logger writes a
// logline.Fields line itself, which must not show.
func TestNewLoggerLines(t *testing.T) {
	var _ logline.Fields = lineFields{}
	clock := fixedClock{time.Date(2026, 5, 6, 7, 8, 9, 123456789, time.FixedZone("X", 2*3600))}
	logLines := func(log *zap.Logger) {
		log = log.WithOptions(zap.WithClock(clock))
		log.Info("request", zap.Inline(lineFields{`a "b" é` + "\n"}))
		log.Debug("request", zap.Inline(lineFields{"hidden"}))
		log.Warn("request rejected", zap.String("key", "k"), zap.Int("status", 429))
		log.With(zap.String("component", "proxy")).Info("request", zap.Inline(lineFields{"c"}))
		log.Named("admin").Info("request", zap.Inline(lineFields{"d"}))
	}
	for _, format := range []string{"", "json", "console"} {
		t.Run(format, func(t *testing.T) {
			var got bytes.Buffer
			log, ws, err := newLogger(config.Log{Level: "info", Format: format}, &got)
			if err != nil {
				t.Fatal(err)
			}
			logLines(log)
			if err := ws.Stop(); err != nil {
				t.Fatal(err)
			}
			encCfg := zap.NewProductionEncoderConfig()
			encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
			enc := zapcore.NewJSONEncoder(encCfg)
			if format == "console" {
				encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
				enc = zapcore.NewConsoleEncoder(encCfg)
			}
			var want bytes.Buffer
			logLines(zap.New(zapcore.NewCore(enc, zapcore.AddSync(&want), zap.InfoLevel)))
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Errorf("lines\n%s\nwant\n%s", got.Bytes(), want.Bytes())
			}
			if want.Len() == 0 || bytes.Contains(want.Bytes(), []byte("hidden")) {
				t.Errorf("reference lines\n%s", want.Bytes())
			}
		})
	}
}
