// Package scripted is an upstream whose replies a test writes itself, on
// the raw connection: headers and body bytes as they are meant to arrive,
// in the writes and with the pauses the test chooses, and ends or resets
// of the connection where it wants them.
package scripted

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Server answers every request on every connection it accepts by calling
// reply with the connection, once the request has been read. reply writes
// the whole response; the connection then serves its next request, unless
// reply closed it.
type Server struct {
	ln       net.Listener
	reply    func(c net.Conn)
	accepted atomic.Int64

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// Start listens on a free port of 127.0.0.1.
func Start(reply func(c net.Conn)) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, reply: reply}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Accepted is how many connections the server has accepted.
func (s *Server) Accepted() int64 { return s.accepted.Load() }

// Close stops listening, closes every connection, and waits for the
// replies in progress to return.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Go(func() { s.serve(c) })
	}
}

func (s *Server) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		s.reply(c)
	}
}
