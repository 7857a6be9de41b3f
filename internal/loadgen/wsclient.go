package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// wsRequester speaks the Sluice WebSocket bridge protocol: request frames
// {"type":"request","id":…,"path":…,"body":{…}} answered by chunk, done
// and error frames, many requests in flight on each socket. A cancelled
// request sends {"type":"cancel","id":…}.
type wsRequester struct {
	url    string
	path   string
	header http.Header
	dialer *websocket.Dialer
	ids    atomic.Uint64
	next   atomic.Uint64
	slots  []wsSlot
}

// wsSlot holds one socket, dialled on first use and again after it breaks.
type wsSlot struct {
	mu   sync.Mutex
	conn *wsConn
}

func newWSRequester(c Config, target string, tc *tls.Config, header http.Header) (*wsRequester, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parsing target: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme, u.Path = "ws", strings.TrimSuffix(u.Path, "/")+c.WSPath
	case "https":
		u.Scheme, u.Path = "wss", strings.TrimSuffix(u.Path, "/")+c.WSPath
	}
	h := http.Header{}
	for k, v := range header {
		switch k {
		case "Content-Type", "Accept", "Te":
		default:
			h[k] = v
		}
	}
	return &wsRequester{
		url:    u.String(),
		path:   c.Path,
		header: h,
		dialer: &websocket.Dialer{
			TLSClientConfig:  tc,
			HandshakeTimeout: 10 * time.Second,
			ReadBufferSize:   4 << 10,
			WriteBufferSize:  4 << 10,
		},
		slots: make([]wsSlot, max(c.WSConns, 1)),
	}, nil
}

func (w *wsRequester) close() error {
	var errs []error
	for i := range w.slots {
		s := &w.slots[i]
		s.mu.Lock()
		if s.conn != nil {
			errs = append(errs, s.conn.close())
			s.conn = nil
		}
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// conn returns a live socket of the next slot, dialling if needed.
func (w *wsRequester) conn(ctx context.Context) (*wsConn, error) {
	s := &w.slots[w.next.Add(1)%uint64(len(w.slots))]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		if !s.conn.broken() {
			return s.conn, nil
		}
		_ = s.conn.close()
		s.conn = nil
	}
	c, resp, err := w.dialer.DialContext(ctx, w.url, w.header)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("websocket handshake: %s: %w", resp.Status, err)
		}
		return nil, fmt.Errorf("dialling websocket: %w", err)
	}
	c.SetReadLimit(maxEventSize)
	s.conn = newWSConn(c)
	return s.conn, nil
}

func (w *wsRequester) do(ctx context.Context, j *job, res *Result) {
	wc, err := w.conn(ctx)
	if err != nil {
		res.Class, res.Err = classifyErr(ctx, err), errText(err)
		if res.Class == ClassTransport {
			res.Class = ClassConnect
		}
		return
	}
	id := "r" + strconv.FormatUint(w.ids.Add(1), 10)
	frame, _ := json.Marshal(wsRequest{Type: "request", ID: id, Path: w.path, Body: j.Body})
	call := &wsCall{st: streamState{res: res, start: time.Now()}, finished: make(chan struct{})}
	wc.add(id, call)
	if err := wc.write(frame); err != nil {
		if wc.remove(id) {
			res.Class, res.Err = ClassTransport, err.Error()
			res.E2E = time.Since(call.st.start)
		}
		<-call.finished
		return
	}
	select {
	case <-call.finished:
	case <-ctx.Done():
		if wc.remove(id) {
			cancel, _ := json.Marshal(wsRequest{Type: "cancel", ID: id})
			_ = wc.write(cancel)
			finishStream(ctx, ctx.Err(), call.st.start, res)
		}
		<-call.finished
	}
	call.st.settleTokens()
}

type wsRequest struct {
	Type string          `json:"type"`
	ID   string          `json:"id"`
	Path string          `json:"path,omitempty"`
	Body json.RawMessage `json:"body,omitempty"`
}

// wsCall is one request in flight on a socket. Its state is written only
// by the socket's read loop while the call is registered.
type wsCall struct {
	st       streamState
	finished chan struct{}
}

// wsConn is one socket with its read loop.
type wsConn struct {
	c       *websocket.Conn
	wmu     sync.Mutex // one writer at a time
	mu      sync.Mutex // guards pending, dead and the state of pending calls
	pending map[string]*wsCall
	dead    bool
	loopEnd chan struct{}
}

func newWSConn(c *websocket.Conn) *wsConn {
	wc := &wsConn{c: c, pending: map[string]*wsCall{}, loopEnd: make(chan struct{})}
	go wc.readLoop()
	return wc
}

func (wc *wsConn) broken() bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.dead
}

// add registers a call; on a dead socket the call ends at once, truncated
// (the socket broke between dialling and sending).
func (wc *wsConn) add(id string, call *wsCall) {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	if wc.dead {
		call.st.res.Class, call.st.res.Err = ClassTransport, "websocket closed"
		close(call.finished)
		return
	}
	wc.pending[id] = call
}

// remove unregisters a call and closes its finished channel; it reports
// false when the read loop had already finished the call.
func (wc *wsConn) remove(id string) bool {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	call, ok := wc.pending[id]
	if ok {
		delete(wc.pending, id)
		close(call.finished)
	}
	return ok
}

func (wc *wsConn) write(frame []byte) error {
	wc.wmu.Lock()
	defer wc.wmu.Unlock()
	_ = wc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := wc.c.WriteMessage(websocket.TextMessage, frame); err != nil {
		return fmt.Errorf("writing websocket frame: %w", err)
	}
	return nil
}

func (wc *wsConn) close() error {
	wc.wmu.Lock()
	_ = wc.c.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	wc.wmu.Unlock()
	err := wc.c.Close()
	<-wc.loopEnd
	return err
}

// readLoop dispatches frames to their calls until the socket fails; then
// every call still in flight is truncated.
func (wc *wsConn) readLoop() {
	defer close(wc.loopEnd)
	var buf bytes.Buffer
	var f wsFrame
	for {
		_, r, err := wc.c.NextReader()
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		now := time.Now()
		if err != nil {
			wc.fail(now, err)
			return
		}
		f.reset()
		if json.Unmarshal(buf.Bytes(), &f) != nil {
			continue // not a frame of this protocol
		}
		wc.dispatch(now, &f)
	}
}

// fail ends every pending call as truncated: the socket closed before
// their done or error frame.
func (wc *wsConn) fail(now time.Time, err error) {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	wc.dead = true
	for id, call := range wc.pending {
		res := call.st.res
		res.Class, res.Truncated = ClassTruncated, true
		res.Err = "websocket closed before done: " + err.Error()
		res.E2E = now.Sub(call.st.start)
		delete(wc.pending, id)
		close(call.finished)
	}
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type wsFrame struct {
	Type   string          `json:"type"`
	ID     string          `json:"id"`
	Data   json.RawMessage `json:"data"`
	Usage  *usage          `json:"usage"`
	Timing json.RawMessage `json:"timing"`
	Status int             `json:"status"`
	Error  json.RawMessage `json:"error"`
}

func (f *wsFrame) reset() {
	*f = wsFrame{Data: f.Data[:0], Timing: f.Timing[:0], Error: f.Error[:0]}
}

func (wc *wsConn) dispatch(now time.Time, f *wsFrame) {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	call := wc.pending[f.ID]
	if call == nil {
		return
	}
	res := call.st.res
	res.Events++
	final := true
	switch f.Type {
	case "chunk":
		final = call.st.event(now, nil, f.Data) != nil
	case "done":
		res.Done, res.Status, res.E2E = true, 200, now.Sub(call.st.start)
		if f.Usage != nil {
			call.st.usageSeen, res.TokensOut = true, f.Usage.CompletionTokens
		}
		res.Timing = append(res.Timing, parseTimingJSON(f.Timing)...)
	case "error":
		res.Status, res.E2E = f.Status, now.Sub(call.st.start)
		res.Class, res.Err = classifyStatus(f.Status), errorMessage(f.Error)
		if res.Class == ClassOK || res.Class == ClassHTTPOther {
			res.Class = ClassStreamError
		}
	default:
		final = false
	}
	if res.Status == 0 {
		res.Status = 200 // the bridge answered; an error frame sets its own
	}
	if final || res.Class != ClassOK {
		delete(wc.pending, f.ID)
		close(call.finished)
	}
}

// parseTimingJSON reads the timing of a done frame: a Server-Timing string,
// or an object of name → milliseconds (or name → {"dur":…,"desc":…}), in
// the object's order.
func parseTimingJSON(raw json.RawMessage) []Metric {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return ParseServerTiming(nil, s)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var out []Metric
	for dec.More() {
		t, err := dec.Token()
		name, ok := t.(string)
		var v json.RawMessage
		if err != nil || !ok || dec.Decode(&v) != nil {
			return out
		}
		if m, ok := timingValue(name, v); ok {
			out = append(out, m)
		}
	}
	return out
}

func timingValue(name string, v json.RawMessage) (Metric, bool) {
	var d float64
	if json.Unmarshal(v, &d) == nil {
		return Metric{Name: name, Dur: d, HasDur: true}, true
	}
	var o struct {
		Dur  *float64 `json:"dur"`
		Desc string   `json:"desc"`
	}
	if json.Unmarshal(v, &o) != nil {
		return Metric{}, false
	}
	m := Metric{Name: name, Desc: o.Desc}
	if o.Dur != nil {
		m.Dur, m.HasDur = *o.Dur, true
	}
	return m, true
}
