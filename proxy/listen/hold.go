package listen

import "context"

// serverKey carries the Server in its base context (for Hold).
type serverKey struct{}

// Hold counts a request that outlives its handler as running: a committed
// HTTP/1.1 stream that the proxy's event loop relays after the handler
// returned (its connection hijacked). Shutdown waits for it as for a
// running handler, until the drain deadline; stopped is then cancelled
// with ErrDraining (the cause the handlers' contexts get), and the request
// must end promptly, calling release (exactly once) when its last bytes
// are out. Hold must be called while the request's handler still runs.
// Outside a Server, stopped is nil (never cancelled) and release does
// nothing.
func Hold(ctx context.Context) (release func(), stopped context.Context) {
	s, _ := ctx.Value(serverKey{}).(*Server)
	if s == nil {
		return func() {}, nil
	}
	s.active.Add(1)
	s.running.Add(1)
	return func() { s.handlerDone(); s.active.Done() }, s.base
}
