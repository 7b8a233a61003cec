package sockpeek

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (local, peer *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p := <-accepted
	if p == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); p.Close() })
	return c.(*net.TCPConn), p.(*net.TCPConn)
}

// peek peeks at c's socket.
func peek(t *testing.T, c *net.TCPConn) (State, error) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var st State
	var perr error
	if err := rc.Control(func(fd uintptr) { st, perr = Peek(fd) }); err != nil {
		t.Fatal(err)
	}
	return st, perr
}

// peekUntil peeks at c until it holds something other than Empty, which
// it does once what the peer sent has crossed the loopback.
func peekUntil(t *testing.T, c *net.TCPConn) (State, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := peek(t, c)
		if st != Empty || time.Now().After(deadline) {
			return st, err
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPeek(t *testing.T) {
	if !Supported {
		t.Skip("sockpeek: this platform cannot peek at sockets")
	}
	t.Run("nothing sent yet", func(t *testing.T) {
		c, _ := pair(t)
		if st, err := peek(t, c); st != Empty || err != nil {
			t.Fatalf("Peek = %v, %v; want empty, nil", st, err)
		}
	})
	t.Run("bytes, left for the reader", func(t *testing.T) {
		c, p := pair(t)
		if _, err := p.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		for range 2 { // a peek takes nothing, so the second sees the same
			if st, err := peekUntil(t, c); st != Data || err != nil {
				t.Fatalf("Peek = %v, %v; want data, nil", st, err)
			}
		}
		buf := make([]byte, 2)
		if n, err := c.Read(buf); n != 2 || err != nil || string(buf) != "hi" {
			t.Fatalf("Read after the peeks = %d %q %v; want the 2 bytes sent", n, buf[:n], err)
		}
	})
	t.Run("bytes before the end come first", func(t *testing.T) {
		c, p := pair(t)
		if _, err := p.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		p.Close()
		if st, err := peekUntil(t, c); st != Data || err != nil {
			t.Fatalf("Peek = %v, %v; want data, nil", st, err)
		}
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if st, err := peekUntil(t, c); st != Closed || err != nil {
			t.Fatalf("Peek once the byte was read = %v, %v; want closed, nil", st, err)
		}
	})
	t.Run("the peer's end", func(t *testing.T) {
		c, p := pair(t)
		p.Close()
		if st, err := peekUntil(t, c); st != Closed || err != nil {
			t.Fatalf("Peek = %v, %v; want closed, nil", st, err)
		}
	})
	t.Run("the peer's reset", func(t *testing.T) {
		c, p := pair(t)
		if err := p.SetLinger(0); err != nil { // close with RST
			t.Fatal(err)
		}
		p.Close()
		st, err := peekUntil(t, c)
		if st != Failed || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Peek = %v, %v; want failed, ECONNRESET", st, err)
		}
	})
}

func TestStateString(t *testing.T) {
	for st, want := range map[State]string{Empty: "empty", Data: "data", Closed: "closed", Failed: "failed", State(9): "unknown"} {
		if got := st.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", int(st), got, want)
		}
	}
}
