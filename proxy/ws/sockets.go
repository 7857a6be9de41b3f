package ws

import "sync"

// Defaults of Config.MaxSocketsPerAddr and Config.MaxSocketsPerTenant.
const (
	DefaultMaxSocketsPerAddr   = 256
	DefaultMaxSocketsPerTenant = 1024
)

// Sockets counts the open WebSocket sockets of a node by client address
// and by tenant, so that neither can hold more than its cap. The zero
// value is ready; it is safe for simultaneous use by multiple goroutines.
type Sockets struct {
	mu       sync.Mutex
	byAddr   map[string]int
	byTenant map[string]int
}

// Over names the cap an Acquire refusal hit.
type Over int

// Caps Acquire can refuse on.
const (
	OverNone Over = iota
	OverAddr
	OverTenant
)

// Acquire takes a place for one socket of tenant from addr, unless addr
// already holds maxAddr sockets or tenant maxTenant (zero or negative: the
// defaults). On success release frees the place; it is idempotent and
// must run on every exit path.
func (s *Sockets) Acquire(addr, tenant string, maxAddr, maxTenant int) (release func(), over Over) {
	if maxAddr <= 0 {
		maxAddr = DefaultMaxSocketsPerAddr
	}
	if maxTenant <= 0 {
		maxTenant = DefaultMaxSocketsPerTenant
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byAddr == nil {
		s.byAddr, s.byTenant = map[string]int{}, map[string]int{}
	}
	if s.byAddr[addr] >= maxAddr {
		return nil, OverAddr
	}
	if s.byTenant[tenant] >= maxTenant {
		return nil, OverTenant
	}
	s.byAddr[addr]++
	s.byTenant[tenant]++
	return sync.OnceFunc(func() { s.release(addr, tenant) }), OverNone
}

func (s *Sockets) release(addr, tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byAddr[addr]--; s.byAddr[addr] <= 0 {
		delete(s.byAddr, addr)
	}
	if s.byTenant[tenant]--; s.byTenant[tenant] <= 0 {
		delete(s.byTenant, tenant)
	}
}

// Open returns the sockets counted in all (by address; each is also
// counted once by tenant) and the number of addresses and tenants that
// hold any.
func (s *Sockets) Open() (sockets, addrs, tenants int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.byAddr {
		sockets += n
	}
	return sockets, len(s.byAddr), len(s.byTenant)
}
