package listen

// StartDrain makes Draining report true, so /readyz fails, while the
// listeners keep serving: load balancers notice before Shutdown closes
// them. Shutdown calls it too.
func (s *Server) StartDrain() { s.draining.Store(true) }
