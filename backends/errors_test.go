package backends

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"github.com/valyala/fasthttp"
)

// timeoutErr is a net.Error that timed out, like a read past its deadline.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
		bfb  bool
	}{
		{"dial timeout", fasthttp.ErrDialTimeout, "dial", false},
		{"no free connections", fasthttp.ErrNoFreeConns, "dial", false},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, "dial", false},
		{"awaiting headers", fasthttp.ErrTimeout, "timeout", true},
		{"mid-body", &net.OpError{Op: "read", Err: timeoutErr{}}, "timeout", false},
		{"deadline", os.ErrDeadlineExceeded, "timeout", false},
		{"closed", io.EOF, "conn", false},
		{"reset", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, "conn", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classify(tt.err)
			var (
				de DialError
				te TimeoutError
				ce ConnError
			)
			got := ""
			switch {
			case errors.As(err, &de):
				got = "dial"
			case errors.As(err, &te):
				got = "timeout"
				if te.BeforeFirstByte != tt.bfb {
					t.Errorf("BeforeFirstByte = %v, want %v", te.BeforeFirstByte, tt.bfb)
				}
			case errors.As(err, &ce):
				got = "conn"
			}
			if got != tt.want || !errors.Is(err, tt.err) {
				t.Errorf("classify(%v) = %T, want a %s error wrapping it", tt.err, err, tt.want)
			}
		})
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}
