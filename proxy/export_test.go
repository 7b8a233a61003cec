package proxy

// SetBackgroundCapacity bounds the background responses s waits on, so
// that a test can fill the set.
func SetBackgroundCapacity(s *Server, n int) {
	s.background.mu.Lock()
	defer s.background.mu.Unlock()
	s.background.capacity = n
}
