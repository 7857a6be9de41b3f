package gpusim

import "net/http"

// Sim is a placeholder until the simulator lands.
type Sim struct{ http.Handler }

// New is a placeholder until the simulator lands.
func New(cfg Config) *Sim { return &Sim{http.NotFoundHandler()} }

// Close is a placeholder until the simulator lands.
func (s *Sim) Close() {}

// RegisterFlags is a placeholder until the simulator lands.
func (c *Config) RegisterFlags(fs interface {
	StringVar(*string, string, string, string)
}) {}
