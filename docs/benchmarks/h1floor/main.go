// Command h1floor measures what Go's goroutine-per-connection model costs a
// reverse proxy on this machine, with nothing of Sluice in it, for
// docs/BENCHMARKS.md, "h1floor". It relays HTTP/1.1 from its listener to one
// backend as plainly as Go allows: a goroutine per client connection, one
// kept backend connection pinned to it (dialled on the first request, as an
// upstream keep-alive pool would hand back), the request head and body
// written to the backend in one write, the answer's head and a
// Content-Length body written to the client in one write, a chunked body
// relayed read by read (each read written at once: no token held back) until
// its last chunk. net.Conn reads and writes through Go's netpoller; no
// parsing beyond the framing, no header rewriting, no auth, limits, routing,
// timing, metrics or access log. What it costs per request and per token is
// the floor any Go proxy built on goroutines pays before its own work.
//
// It is not a proxy to run: it trusts its client (no size limits beyond its
// buffer, one backend, no timeouts) and exists for the benchmark only.
//
//	go run ./docs/benchmarks/h1floor -listen 127.0.0.1:PORT -backend 127.0.0.1:PORT
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTP/1.1 on")
	backend := flag.String("backend", "", "backend address (host:port)")
	flag.Parse()
	if *backend == "" {
		log.Fatal("h1floor: -backend is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "h1floor: %s -> %s\n", ln.Addr(), *backend)
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		<-sig
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by the signal
		}
		go serve(c, *backend)
	}
}

// conn is one side of the relay: its socket and a reader over it.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func serve(client net.Conn, backend string) {
	defer client.Close()
	cl := conn{c: client, r: bufio.NewReaderSize(client, 16<<10)}
	var up *conn
	defer func() {
		if up != nil {
			up.c.Close()
		}
	}()
	out := make([]byte, 0, 16<<10)
	for {
		var n int64
		var isChunked bool
		var err error
		out, n, isChunked, err = readHead(cl.r, out[:0])
		if err != nil || isChunked {
			return // EOF between requests, or a chunked request (not in the benchmark)
		}
		if out, err = appendBody(out, cl.r, n); err != nil {
			return
		}
		if up == nil {
			bc, err := net.Dial("tcp", backend)
			if err != nil {
				client.Write([]byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
				return
			}
			up = &conn{c: bc, r: bufio.NewReaderSize(bc, 16<<10)}
		}
		if _, err := up.c.Write(out); err != nil {
			return
		}
		if err := relayAnswer(client, up.r, out[:0]); err != nil {
			return
		}
	}
}

// relayAnswer copies one response from the backend's reader to the client.
func relayAnswer(client net.Conn, br *bufio.Reader, out []byte) error {
	out, n, isChunked, err := readHead(br, out)
	if err != nil {
		return err
	}
	if !isChunked {
		if out, err = appendBody(out, br, n); err != nil {
			return err
		}
		_, err = client.Write(out)
		return err
	}
	// Chunked: what has arrived goes out with each read, the head with the
	// first; the chunk framing is followed (internal/chunked, the decoder the
	// event loops use) only to find the last chunk.
	var d chunked.Decoder
	var scratch []byte // Decode's payload, not used: the framing is followed only to find the end
	for {
		k := br.Buffered()
		if k == 0 {
			if len(out) > 0 {
				if _, err := client.Write(out); err != nil {
					return err
				}
				out = out[:0]
			}
			if _, err := br.Peek(1); err != nil {
				return err
			}
			k = br.Buffered()
		}
		b, _ := br.Peek(k)
		var used int
		var done bool
		scratch, used, done, err = d.Decode(scratch[:0], b)
		if err != nil {
			return err
		}
		out = append(out, b[:used]...)
		br.Discard(used)
		if done {
			_, err := client.Write(out)
			return err
		}
	}
}

// readHead appends a message head (through the blank line) read from r to
// out and returns it with the head's Content-Length (0 when absent) and
// whether the body is chunked.
func readHead(r *bufio.Reader, out []byte) (_ []byte, n int64, chunked bool, err error) {
	var head []byte
	for want := 1; ; want = r.Buffered() + 1 {
		// Peek(want) reads only when fewer than want bytes are buffered: one
		// read per pass, never a wait for bytes the peer has not sent.
		if want > r.Size() {
			return out, 0, false, errors.New("head too large")
		}
		if _, err := r.Peek(want); err != nil {
			return out, 0, false, err // io.EOF between messages included
		}
		b, _ := r.Peek(r.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			head = b[:i+4]
			break
		}
	}
	for _, line := range bytes.Split(head[:len(head)-4], []byte("\r\n"))[1:] {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if n, err = strconv.ParseInt(string(value), 10, 64); err != nil || n < 0 {
				return out, 0, false, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		}
	}
	out = append(out, head...)
	r.Discard(len(head))
	return out, n, chunked, nil
}

// appendBody appends n body bytes read from r to out.
func appendBody(out []byte, r *bufio.Reader, n int64) ([]byte, error) {
	for n > 0 {
		b, err := r.Peek(min(int(n), r.Size()))
		if len(b) == 0 && err != nil {
			return out, err
		}
		out = append(out, b...)
		r.Discard(len(b))
		n -= int64(len(b))
	}
	return out, nil
}
