package evloop

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// benchEvent is a typical token chunk.
var benchEvent = []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}` + "\n\n")

// benchRelay does per event what the proxy's relay does at least: the
// event as one chunk.
type benchRelay struct{ closed chan struct{} }

func (r *benchRelay) Event(out, ev []byte, _ time.Time) ([]byte, bool) {
	return chunked.AppendChunk(out, ev), false
}
func (r *benchRelay) End(out []byte, _ error) ([]byte, bool) {
	return chunked.AppendLast(out, nil), false
}
func (r *benchRelay) Closed(error, int64) { close(r.closed) }

// goroutineRelay is the design the loop replaces, on the same sockets: a
// goroutine per stream blocked in a read through a bufio.Reader and the
// chunked reader, one write per event.
func goroutineRelay(up, cl net.Conn) {
	defer up.Close()
	defer cl.Close()
	br := bufio.NewReaderSize(httputil.NewChunkedReader(bufio.NewReaderSize(up, 4<<10)), 4<<10)
	var ev, out []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		ev = append(ev, line...)
		if len(line) > 2 || len(line) == 2 && line[0] != '\r' {
			continue
		}
		out = chunked.AppendChunk(out[:0], ev)
		ev = ev[:0]
		if _, err := cl.Write(out); err != nil {
			return
		}
	}
}

// BenchmarkRelay relays b.N events over 64 streams, one event per stream
// in turn (each event its own wake-up), on the loop and on a goroutine per
// stream. cpu-ns/event is the whole process's CPU (feeder and readers
// included, the same in both) per event; allocs count the relay's (the
// harness allocates nothing per event).
func BenchmarkRelay(b *testing.B) {
	for _, streams := range []int{64} {
		for _, mode := range []string{"loop", "goroutine"} {
			b.Run(fmt.Sprintf("%s/streams=%d", mode, streams), func(b *testing.B) { runRelayBench(b, mode, streams) })
		}
	}
}

func runRelayBench(b *testing.B, mode string, streams int) {
	ln := listen(b)
	var g *Group
	if mode != "goroutine" {
		var err error
		if g, err = New(Options{}); err != nil {
			b.Fatal(err)
		}
		defer g.Close()
	}
	ups := make([]net.Conn, streams)
	cls := make([]net.Conn, streams)
	relays := make([]*benchRelay, streams)
	var wg sync.WaitGroup
	for i := range streams {
		cs, cl := pair(b, ln)
		us, up := pair(b, ln)
		ups[i], cls[i] = up, cl
		relays[i] = &benchRelay{closed: make(chan struct{})}
		if g != nil {
			if _, err := g.Add(&Stream{Client: cs, Upstream: us, Decoder: new(chunked.Decoder), Relay: relays[i]}); err != nil {
				b.Fatal(err)
			}
		} else {
			wg.Add(1)
			go func() { defer wg.Done(); goroutineRelay(us, cs) }()
		}
	}
	wire := chunked.AppendChunk(nil, benchEvent)
	per := int64(len(wire)) // the client gets each event as the same chunk
	// Readers: each stream's client reads its share.
	var rwg sync.WaitGroup
	for i := range streams {
		n := int64(b.N / streams)
		if i < b.N%streams {
			n++
		}
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			buf := make([]byte, 32<<10)
			want := n * per
			cls[i].SetReadDeadline(time.Now().Add(5 * time.Minute))
			for got := int64(0); got < want; {
				k, err := cls[i].Read(buf)
				if err != nil {
					b.Errorf("stream %d: %v after %d of %d bytes", i, err, got, want)
					return
				}
				got += int64(k)
			}
		}()
	}
	var ru0, ru1 unix.Rusage
	b.ReportAllocs()
	b.ResetTimer()
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	for i := range b.N {
		if _, err := ups[i%streams].Write(wire); err != nil {
			b.Fatal(err)
		}
	}
	rwg.Wait()
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	b.StopTimer()
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
	for i := range streams {
		ups[i].Close()
		io.Copy(io.Discard, cls[i])
		cls[i].Close()
	}
	if g != nil {
		for _, r := range relays {
			<-r.closed
		}
	}
	wg.Wait()
}
