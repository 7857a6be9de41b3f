package listen

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// startH2 serves h on a cleartext and a TLS listener with Sluice's own
// HTTP/2 server and the given limits (edit may change the defaults).
func startH2(t *testing.T, h http.Handler, edit func(*h2Limits)) *Server {
	t.Helper()
	lim := defaultH2Limits(DefaultIdleTimeout)
	if edit != nil {
		edit(&lim)
	}
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	cfg := ts.TLS.Clone()
	ts.Close()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	off := false
	s := &Server{Handler: h, HTTPAddr: "127.0.0.1:0", HTTPSAddr: "127.0.0.1:0", TLSConfig: cfg,
		HTTP3: HTTP3Config{Enabled: &off}, H2Server: H2ServerSluice, h2limits: &lim,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return s
}

// rawH2 is a client speaking frames to an h2c listener.
type rawH2 struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

func dialH2(t *testing.T, s *Server) *rawH2 {
	t.Helper()
	nc, err := net.Dial("tcp", s.Addr(ListenerHTTP))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawH2{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.enc = hpack.NewEncoder(&c.hbuf)
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(nc, http2.ClientPreface)
	c.fr.WriteSettings()
	return c
}

// headers encodes a GET (plus extra fields) for stream id.
func (c *rawH2) block(extra ...string) []byte {
	c.hbuf.Reset()
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: "x"}, {Name: ":path", Value: "/"}} {
		c.enc.WriteField(f)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1]})
	}
	return bytes.Clone(c.hbuf.Bytes())
}

func (c *rawH2) get(id uint32, extra ...string) {
	c.t.Helper()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block(extra...),
		EndStream: true, EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
}

// until reads frames until match returns true; it fails on EOF or
// timeout.
func (c *rawH2) until(what string, match func(http2.Frame) bool) {
	c.t.Helper()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", what, err)
		}
		if match(f) {
			return
		}
	}
}

// goAway reads until a GOAWAY and returns its code, then expects EOF.
func (c *rawH2) goAway() http2.ErrCode {
	c.t.Helper()
	var code http2.ErrCode
	c.until("GOAWAY", func(f http2.Frame) bool {
		g, ok := f.(*http2.GoAwayFrame)
		if ok {
			code = g.ErrCode
		}
		return ok
	})
	c.closed()
	return code
}

// closed expects the server to close the connection.
func (c *rawH2) closed() {
	c.t.Helper()
	for {
		if _, err := c.fr.ReadFrame(); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
				c.t.Fatalf("want the connection closed; got %v", err)
			}
			return
		}
	}
}

func TestH2RefusesStreamsPastMaxConcurrent(t *testing.T) {
	release := make(chan struct{})
	var started atomic.Int32
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		<-release
	}), func(l *h2Limits) { l.maxStreams = 2 })
	defer close(release)
	c := dialH2(t, s)
	c.get(1)
	c.get(3)
	for deadline := time.Now().Add(5 * time.Second); started.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("handlers did not start")
		}
	}
	c.get(5)
	c.until("RST_STREAM 5", func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		if ok && (r.StreamID != 5 || r.ErrCode != http2.ErrCodeRefusedStream) {
			t.Fatalf("got RST_STREAM %d %v; want 5 REFUSED_STREAM", r.StreamID, r.ErrCode)
		}
		return ok
	})
	if n := started.Load(); n != 2 {
		t.Fatalf("%d handlers ran; want 2", n)
	}
}

func TestH2HeaderListTooLarge(t *testing.T) {
	var ran atomic.Bool
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran.Store(true) }),
		func(l *h2Limits) { l.maxHeaderList = 1024 })
	c := dialH2(t, s)
	var extra []string
	for i := range 20 {
		extra = append(extra, fmt.Sprintf("x-h%d", i), strings.Repeat("v", 100))
	}
	c.get(1, extra...)
	var status string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			status = f.Value
		}
	})
	c.until("response HEADERS", func(f http2.Frame) bool {
		h, ok := f.(*http2.HeadersFrame)
		if ok {
			dec.Write(h.HeaderBlockFragment())
		}
		return ok
	})
	if status != "431" || ran.Load() {
		t.Fatalf("status %q, handler ran %v; want 431 without the handler", status, ran.Load())
	}
	c.get(3) // the connection still serves
	c.until("second response", func(f http2.Frame) bool { _, ok := f.(*http2.HeadersFrame); return ok })
}

func TestH2ContinuationFloodEndsConnection(t *testing.T) {
	s := startH2(t, http.NotFoundHandler(), nil)
	c := dialH2(t, s)
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(), EndHeaders: false})
	done := make(chan struct{})
	go func() { // the server stops reading; the writes may fail
		defer close(done)
		for range 10000 {
			if c.fr.WriteContinuation(1, false, nil) != nil {
				return
			}
		}
	}()
	if code := c.goAway(); code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v; want ENHANCE_YOUR_CALM", code)
	}
	<-done
}

func TestH2RapidResetEndsConnection(t *testing.T) {
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }),
		func(l *h2Limits) { l.resets = 20 })
	c := dialH2(t, s)
	block := c.block()
	done := make(chan struct{})
	go func() { // the server stops reading; the writes may fail
		defer close(done)
		for id := uint32(1); id < 200; id += 2 {
			if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true}) != nil ||
				c.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				return
			}
		}
	}()
	if code := c.goAway(); code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v; want ENHANCE_YOUR_CALM", code)
	}
	<-done
}

func TestH2ControlFloodEndsConnection(t *testing.T) {
	for _, kind := range []string{"PING", "SETTINGS"} {
		t.Run(kind, func(t *testing.T) {
			s := startH2(t, http.NotFoundHandler(), func(l *h2Limits) { l.control = 20 })
			c := dialH2(t, s)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range 200 {
					var err error
					if kind == "PING" {
						err = c.fr.WritePing(false, [8]byte{byte(i)})
					} else {
						err = c.fr.WriteSettings()
					}
					if err != nil {
						return
					}
				}
			}()
			if code := c.goAway(); code != http2.ErrCodeEnhanceYourCalm {
				t.Fatalf("GOAWAY %v; want ENHANCE_YOUR_CALM", code)
			}
			<-done
		})
	}
}

func TestH2IdleTimeoutSendsGoAway(t *testing.T) {
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		func(l *h2Limits) { l.idle = 200 * time.Millisecond })
	c := dialH2(t, s)
	start := time.Now() // before the request whose end the idle time counts from
	c.get(1)
	if code := c.goAway(); code != http2.ErrCodeNo {
		t.Fatalf("GOAWAY %v; want NO_ERROR", code)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 3*time.Second {
		t.Fatalf("closed after %v; want about 200ms (+1s grace)", d)
	}
}

func TestH2ReadHeaderTimeout(t *testing.T) {
	s := startH2(t, http.NotFoundHandler(), func(l *h2Limits) { l.readHeader = 200 * time.Millisecond })
	c := dialH2(t, s)
	c.get(1) // a first request: the first-request timer is out of play
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: c.block()[:2], EndHeaders: false})
	start := time.Now()
	c.closed()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v; want about 200ms", d)
	}
}

// TestH2ConnectionLossCancelsEveryHandler: the client's connection ends;
// every stream's handler sees its context done at once.
func TestH2ConnectionLossCancelsEveryHandler(t *testing.T) {
	const n = 5
	var started, cancelled sync.WaitGroup
	started.Add(n)
	cancelled.Add(n)
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		started.Done()
		<-r.Context().Done()
		cancelled.Done()
	}), nil)
	c := dialH2(t, s)
	for i := range n {
		c.get(uint32(2*i + 1))
	}
	started.Wait()
	c.nc.Close()
	done := make(chan struct{})
	go func() { cancelled.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("handlers not cancelled 2s after the connection closed")
	}
}

// TestH2FlowControlWaitsForWindow: a client with a 10-byte window gets
// a 1000-byte body in window-sized DATA frames as it gives credit.
func TestH2FlowControlWaitsForWindow(t *testing.T) {
	body := strings.Repeat("abcdefghij", 100)
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }), nil)
	c := dialH2(t, s)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})
	c.get(1)
	var got bytes.Buffer
	c.until("END_STREAM", func(f http2.Frame) bool {
		d, ok := f.(*http2.DataFrame)
		if !ok {
			return false
		}
		if len(d.Data()) > 10 {
			t.Fatalf("DATA of %d bytes past a 10-byte window", len(d.Data()))
		}
		got.Write(d.Data())
		if len(d.Data()) > 0 {
			c.fr.WriteWindowUpdate(1, uint32(len(d.Data())))
		}
		return d.StreamEnded()
	})
	if got.String() != body {
		t.Fatalf("got %d bytes; want %d", got.Len(), len(body))
	}
}

// h2Clients are Go's HTTP/2 clients for the TLS and the h2c listener.
func h2Clients(t *testing.T) (overTLS, h2c *http.Client) {
	a := &http2.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	b := &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
	t.Cleanup(a.CloseIdleConnections)
	t.Cleanup(b.CloseIdleConnections)
	return &http.Client{Transport: a}, &http.Client{Transport: b}
}

// TestH2WithGoClient: requests over TLS and h2c with Go's HTTP/2 client:
// the request's protocol and TLS state, connection facts, a streamed
// body flushed write by write, a request body larger than the windows,
// and trailers.
func TestH2WithGoClient(t *testing.T) {
	step := make(chan struct{})
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := ConnInfoFrom(r.Context())
		switch r.URL.Path {
		case "/facts":
			fmt.Fprintf(w, "%d %v %s", r.ProtoMajor, r.TLS != nil, info.Proto)
		case "/stream":
			w.Header().Set("trailer", "Server-Timing")
			io.WriteString(w, "one")
			w.(http.Flusher).Flush()
			<-step
			io.WriteString(w, "two")
			w.Header().Set(http.TrailerPrefix+"Server-Timing", "total;dur=1")
		case "/echo":
			n, err := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d %v", n, err)
		}
	}), nil)
	tc, pc := h2Clients(t)
	for _, base := range []string{"https://" + s.Addr(ListenerHTTPS), "http://" + s.Addr(ListenerHTTP)} {
		overTLS := strings.HasPrefix(base, "https")
		cl := pc
		if overTLS {
			cl = tc
		}
		if got := fetch(t, cl, base+"/facts", nil); got != fmt.Sprintf("2 %v h2", overTLS) {
			t.Fatalf("%s facts: got %q", base, got)
		}
		big := bytes.Repeat([]byte("x"), 9<<20)
		if got := fetch(t, cl, base+"/echo", big); got != fmt.Sprintf("%d <nil>", len(big)) {
			t.Fatalf("%s echo: got %q", base, got)
		}
		resp, err := cl.Get(base + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 3)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "one" {
			t.Fatalf("first write: %q %v; want it flushed before the handler goes on", buf, err)
		}
		step <- struct{}{}
		rest, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(rest) != "two" || resp.Trailer.Get("Server-Timing") != "total;dur=1" {
			t.Fatalf("rest %q, trailer %q", rest, resp.Trailer)
		}
	}
}

func fetch(t *testing.T, cl *http.Client, url string, body []byte) string {
	t.Helper()
	var resp *http.Response
	var err error
	if body != nil {
		resp, err = cl.Post(url, "application/octet-stream", bytes.NewReader(body))
	} else {
		resp, err = cl.Get(url)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 {
		t.Fatalf("%s: %s; want HTTP/2", url, resp.Proto)
	}
	return string(b)
}

// TestH2GracefulShutdown: Shutdown sends GOAWAY; the running stream
// finishes; the connection then closes and Shutdown returns.
func TestH2GracefulShutdown(t *testing.T) {
	step := make(chan struct{})
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "one")
		w.(http.Flusher).Flush()
		<-step
		io.WriteString(w, "two")
	}), nil)
	c := dialH2(t, s)
	c.get(1)
	c.until("first DATA", func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	c.until("GOAWAY", func(f http2.Frame) bool {
		g, ok := f.(*http2.GoAwayFrame)
		if ok && (g.LastStreamID != 1 || g.ErrCode != http2.ErrCodeNo) {
			t.Fatalf("GOAWAY last %d %v; want 1 NO_ERROR", g.LastStreamID, g.ErrCode)
		}
		return ok
	})
	c.get(3) // past the GOAWAY: refused
	c.until("RST_STREAM 3", func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		return ok && r.StreamID == 3 && r.ErrCode == http2.ErrCodeRefusedStream
	})
	close(step)
	c.until("END_STREAM", func(f http2.Frame) bool {
		d, ok := f.(*http2.DataFrame)
		return ok && d.StreamEnded()
	})
	c.nc.Close()
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}

// TestH2ShutdownWhileOpening: Shutdown while a client keeps opening
// streams on the connection: every response the client got is whole,
// and Shutdown returns (run with -race: the GOAWAY's last stream id is
// read while the reader takes new streams).
func TestH2ShutdownWhileOpening(t *testing.T) {
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "whole")
	}), nil)
	_, cl := h2Clients(t)
	url := "http://" + s.Addr(ListenerHTTP) + "/"
	if got := fetch(t, cl, url, nil); got != "whole" {
		t.Fatalf("got %q", got)
	}
	var wg sync.WaitGroup
	var ok, failed atomic.Int32
	for range 4 {
		wg.Go(func() {
			for range 200 {
				resp, err := cl.Get(url)
				if err != nil {
					failed.Add(1)
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != "whole" {
					t.Errorf("body %q, %v; want whole", b, err)
					return
				}
				ok.Add(1)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	wg.Wait()
	t.Logf("%d whole responses, %d clients stopped by the shutdown", ok.Load(), failed.Load())
}

// TestH2ReadDeadline: http.ResponseController's read deadline ends a
// body read the client stalls; the write deadline fails writes past it.
func TestH2ReadDeadline(t *testing.T) {
	got := make(chan error, 2)
	s := startH2(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := io.ReadAll(r.Body)
		got <- err
		rc.SetWriteDeadline(time.Now().Add(-time.Second))
		_, err = io.WriteString(w, "late")
		if err == nil {
			err = rc.Flush()
		}
		got <- err
	}), nil)
	c := dialH2(t, s)
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.block(), EndHeaders: true})
	c.fr.WriteData(1, false, []byte("part"))
	select {
	case err := <-got:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("body read: %v; want os.ErrDeadlineExceeded", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("body read not ended by the deadline")
	}
	if err := <-got; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the deadline: %v; want os.ErrDeadlineExceeded", err)
	}
}
