package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, with its ids in hex and its attributes as
// Go values (string, int64, float64, bool or []string).
type Span struct {
	Name                      string
	Kind                      tracepb.Span_SpanKind
	TraceID, SpanID, ParentID string
	TraceState                string
	Start, End                time.Time
	Attrs                     map[string]any
	Events                    []Event
	StatusCode                tracepb.Status_StatusCode
	StatusMsg                 string
	Resource                  map[string]any
}

// Event is one span event.
type Event struct {
	Name  string
	Time  time.Time
	Attrs map[string]any
}

// Event returns the span's first event named name.
func (s Span) Event(name string) (Event, bool) {
	for _, e := range s.Events {
		if e.Name == name {
			return e, true
		}
	}
	return Event{}, false
}

// Receiver collects the spans exported to it.
type Receiver struct {
	// URL is the HTTP endpoint's base URL (http://127.0.0.1:port); the
	// exporter posts to URL+"/v1/traces".
	URL string
	// GRPCAddr is the gRPC endpoint (127.0.0.1:port) when started with
	// StartGRPC.
	GRPCAddr string

	mu       sync.Mutex
	spans    []Span
	requests int
	bad      []string
}

// Start runs an OTLP/HTTP receiver until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// StartGRPC runs an OTLP/gRPC receiver until the test ends.
func StartGRPC(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{GRPCAddr: ln.Addr().String()}
	s := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(s, grpcService{r: r})
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return r
}

type grpcService struct {
	coltrace.UnimplementedTraceServiceServer
	r *Receiver
}

func (g grpcService) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	g.r.add(req)
	return &coltrace.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		r.fail("unexpected " + req.Method + " " + req.URL.Path)
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		r.fail("content type " + ct)
		http.Error(w, "unsupported content type", http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, 16<<20)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			r.fail("gzip: " + err.Error())
			http.Error(w, "bad gzip", http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		r.fail("protobuf: " + err.Error())
		http.Error(w, "bad protobuf", http.StatusBadRequest)
		return
	}
	r.add(&msg)
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (r *Receiver) fail(s string) {
	r.mu.Lock()
	r.bad = append(r.bad, s)
	r.mu.Unlock()
}

func (r *Receiver) add(msg *coltrace.ExportTraceServiceRequest) {
	var spans []Span
	for _, rs := range msg.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Name: s.GetName(), Kind: s.GetKind(), TraceState: s.GetTraceState(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()),
					Start:    time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs: attrs(s.GetAttributes()), StatusCode: s.GetStatus().GetCode(), StatusMsg: s.GetStatus().GetMessage(),
					Resource: res,
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{Name: e.GetName(), Time: time.Unix(0, int64(e.GetTimeUnixNano())), Attrs: attrs(e.GetAttributes())})
				}
				spans = append(spans, sp)
			}
		}
	}
	r.mu.Lock()
	r.requests++
	r.spans = append(r.spans, spans...)
	r.mu.Unlock()
}

func attrs(kvs []*common.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *common.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *common.AnyValue_StringValue:
		return x.StringValue
	case *common.AnyValue_IntValue:
		return x.IntValue
	case *common.AnyValue_DoubleValue:
		return x.DoubleValue
	case *common.AnyValue_BoolValue:
		return x.BoolValue
	case *common.AnyValue_ArrayValue:
		var out []string
		for _, e := range x.ArrayValue.GetValues() {
			if s, ok := e.GetValue().(*common.AnyValue_StringValue); ok {
				out = append(out, s.StringValue)
			}
		}
		return out
	}
	return nil
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Trace returns the received spans of one trace.
func (r *Receiver) Trace(traceID string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Requests is the number of export requests received.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Bad lists the malformed export requests (nil when none).
func (r *Receiver) Bad() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// StartCounting runs an OTLP/HTTP receiver that only counts the spans of
// each export, walking the protobuf wire format without decoding it into
// messages: for benchmarks, where the receiver shares the process (and its
// CPU) with what is measured. It answers as Start's does.
func StartCounting(t testing.TB) (url string, spans *atomic.Int64) {
	t.Helper()
	spans = &atomic.Int64{}
	resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	var bufs sync.Pool // the bodies' buffers, reused: the receiver's garbage is not the exporter's cost
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		buf, _ := bufs.Get().(*bytes.Buffer)
		if buf == nil {
			buf = new(bytes.Buffer)
		}
		defer bufs.Put(buf)
		buf.Reset()
		if _, err := buf.ReadFrom(req.Body); err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		n, ok := countSpans(buf.Bytes())
		if !ok {
			http.Error(w, "bad protobuf", http.StatusBadRequest)
			return
		}
		spans.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(resp)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, spans
}

// countSpans counts ExportTraceServiceRequest.resource_spans(1)
// .scope_spans(2).spans(2) in b.
func countSpans(b []byte) (int64, bool) {
	var n int64
	ok := true
	each := func(b []byte, field protowire.Number, f func([]byte)) {
		for len(b) > 0 && ok {
			num, typ, l := protowire.ConsumeTag(b)
			if l < 0 {
				ok = false
				return
			}
			b = b[l:]
			if typ != protowire.BytesType {
				l = protowire.ConsumeFieldValue(num, typ, b)
				if l < 0 {
					ok = false
					return
				}
				b = b[l:]
				continue
			}
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				ok = false
				return
			}
			b = b[l:]
			if num == field {
				f(v)
			}
		}
	}
	each(b, 1, func(rs []byte) {
		each(rs, 2, func(ss []byte) {
			each(ss, 2, func([]byte) { n++ })
		})
	})
	return n, ok
}
