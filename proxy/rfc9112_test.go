package proxy

import "testing"

func TestScanFraming(t *testing.T) {
	for _, tt := range []struct {
		name string
		raw  string
		want framing
	}{
		{"plain", "Host: gw\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n", framing{contentLength: true}},
		{"both", "Host: gw\r\ncontent-length: 2\r\nTRANSFER-ENCODING: chunked\r\n\r\n", framing{contentLength: true, transferEncodings: 1}},
		{"chunked", "Transfer-Encoding: chunked\r\nTe: trailers\r\n\r\n", framing{transferEncodings: 1}},
		{"chunked then identity", "Transfer-Encoding: chunked\r\ntransfer-encoding: identity\r\n\r\n", framing{transferEncodings: 2}},
		{"space in name", "Host: gw\r\nContent-Length : 2\r\n\r\n", framing{spaceInName: true}},
		{"tab in name", "X\tY: 1\r\n\r\n", framing{spaceInName: true}},
		{"space in value only", "X-Y: a b\tc\r\n\r\n", framing{}},
		{"continuation line", "X-Y: a\r\n Content-Length: 2\r\n\r\n", framing{}},
		{"no colon", "Content-Length\r\n\r\n", framing{}},
		{"empty name", ": v\r\n\r\n", framing{}},
		{"no final newline", "Content-Length: 2", framing{contentLength: true}},
		{"names of the same length", "Content-Lengtx: 2\r\nTransfer-Encodinx: y\r\n\r\n", framing{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := scanFraming([]byte(tt.raw)); got != tt.want {
				t.Errorf("scanFraming = %+v, want %+v", got, tt.want)
			}
		})
	}
}
