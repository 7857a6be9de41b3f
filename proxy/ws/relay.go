package ws

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorilla/websocket"
)

// side names one end of a passthrough relay.
type side int

const (
	sideClient side = iota
	sideBackend
)

// pumpEnd is how one direction of a relay ended: which side failed or
// closed, and why.
type pumpEnd struct {
	side  side
	err   error
	bytes int64 // relayed to the destination
}

// Relay copies frames both ways between a client and a backend socket, one
// goroutine per direction, and pings both sides. When one side closes or
// fails, the other is sent the matching close frame, given CloseGrace to
// answer, and both are closed; when ctx ends first (the server stops),
// both get 1001. relayed is the bytes of the backend's messages delivered
// to the client; err is nil after an ordinary close.
func Relay(ctx context.Context, client, backend *websocket.Conn, cfg Config) (relayed int64, err error) {
	rl := &wsRelay{conns: [2]*websocket.Conn{sideClient: client, sideBackend: backend}, ends: make(chan pumpEnd, 2)}
	for _, c := range rl.conns {
		c.SetReadLimit(int64(cfg.MaxMessageBytes))
		c.SetPongHandler(func(string) error { return c.SetReadDeadline(time.Now().Add(cfg.Liveness())) })
	}
	stop := make(chan struct{})
	defer close(stop)
	go pumpFrames(client, backend, sideClient, cfg.Liveness(), rl.ends)
	go pumpFrames(backend, client, sideBackend, cfg.Liveness(), rl.ends)
	go keepalive(stop, cfg.PingInterval, cfg.Liveness(), client, backend)

	select {
	case first := <-rl.ends:
		rl.take(first)
		rl.forward(first)
		err = first.err
	case <-ctx.Done(): // the server stops: drain time is over
		err = context.Cause(ctx)
		msg := CloseMessage(websocket.CloseGoingAway, "server shutting down")
		for _, c := range rl.conns {
			c.WriteControl(websocket.CloseMessage, msg, time.Now().Add(CloseGrace))
		}
	}
	rl.finish()
	if cleanClose(err) {
		return rl.relayed, nil
	}
	return rl.relayed, err
}

// wsRelay is a running passthrough relay: its two connections and the
// ends of its two directions.
type wsRelay struct {
	conns    [2]*websocket.Conn // by side
	ends     chan pumpEnd
	received int
	relayed  int64 // bytes relayed to the client
}

func (rl *wsRelay) take(e pumpEnd) {
	rl.received++
	rl.relayed += e.bytes
}

// forward sends the other side the close frame that matches how e ended.
func (rl *wsRelay) forward(e pumpEnd) {
	code, text := forwardClose(e)
	rl.conns[1-e.side].WriteControl(websocket.CloseMessage, CloseMessage(code, text), time.Now().Add(CloseGrace))
	if errors.Is(e.err, websocket.ErrReadLimit) {
		Linger(rl.conns[e.side]) // gorilla has sent it 1009; let that arrive
	}
}

// finish gives the directions still running CloseGrace to end (each side
// answering its close frame), then closes both connections and waits.
func (rl *wsRelay) finish() {
	t := time.NewTimer(CloseGrace)
	defer t.Stop()
wait:
	for rl.received < 2 {
		select {
		case e := <-rl.ends:
			rl.take(e)
		case <-t.C:
			break wait
		}
	}
	for _, c := range rl.conns {
		c.Close()
	}
	for rl.received < 2 {
		rl.take(<-rl.ends)
	}
}

var errWriteFailed = errors.New("write failed")

// pumpFrames copies messages from src to dst until either fails. from is
// src's side; a failed write is reported as the other side's failure.
func pumpFrames(src, dst *websocket.Conn, from side, liveness time.Duration, ends chan<- pumpEnd) {
	var n int64
	for {
		src.SetReadDeadline(time.Now().Add(liveness))
		mt, msg, err := src.ReadMessage()
		if err != nil {
			ends <- pumpEnd{side: from, err: err, bytes: n}
			return
		}
		dst.SetWriteDeadline(time.Now().Add(liveness))
		if err := dst.WriteMessage(mt, msg); err != nil {
			ends <- pumpEnd{side: 1 - from, err: fmt.Errorf("%w: %w", errWriteFailed, err), bytes: n}
			return
		}
		if from == sideBackend {
			n += int64(len(msg))
		}
	}
}

// keepalive pings every connection each interval until stop is closed.
func keepalive(stop <-chan struct{}, interval, liveness time.Duration, conns ...*websocket.Conn) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, c := range conns {
				c.WriteControl(websocket.PingMessage, nil, time.Now().Add(liveness))
			}
		}
	}
}

// forwardClose is the close frame the other side gets when e.side closed
// or failed: the same code for a clean close, 1009 for an oversized
// message, else 1001 (the client went away) or 1014 (the backend failed).
func forwardClose(e pumpEnd) (int, string) {
	var ce *websocket.CloseError
	if errors.As(e.err, &ce) && ce.Code != websocket.CloseAbnormalClosure && ce.Code != websocket.CloseTLSHandshake {
		return ce.Code, ce.Text
	}
	if errors.Is(e.err, websocket.ErrReadLimit) {
		return websocket.CloseMessageTooBig, "message too big"
	}
	if e.side == sideBackend {
		return CloseBadGateway, "backend connection failed"
	}
	return websocket.CloseGoingAway, "client went away"
}

// cleanClose reports whether a relay ended by an ordinary close.
func cleanClose(err error) bool {
	return websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived)
}
