// Command repro is a throwaway HTTP/3 server (quic-go, no Sluice) that
// streams SSE chat chunks and ends the body the way a server may, so that
// check-h3.mjs can show a real Chromium failing, or not, on each ending:
//
//	-end late      the last event flushed, then a Server-Timing trailer
//	               -delay later (issue 17's failing case)
//	-end together  the last event written unflushed and the trailer right
//	               after, as Sluice's httpSink.End does when a client sent
//	               "TE: trailers"
//	-end none      the last event and FIN, no trailer (what Sluice sends to
//	               browsers, which cannot send TE)
//
// It serves TLS over TCP on the same port with the same in-memory
// self-signed certificate, where check-h3.mjs reads the SPKI hash.
//
//	go run ./docs/browser/repro -addr 127.0.0.1:18444 -end late -delay 5ms
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"time"

	"github.com/quic-go/quic-go/http3"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18444", "UDP (HTTP/3) and TCP (TLS, for the SPKI hash) address")
	end := flag.String("end", "late", "how the body ends: late, together or none")
	delay := flag.Duration("delay", 5*time.Millisecond, "with -end late: time between the flushed last event and the trailer")
	events := flag.Int("events", 16, "token events before the finish event and [DONE]")
	gap := flag.Duration("gap", 5*time.Millisecond, "time between token events")
	flag.Parse()
	if *end != "late" && *end != "together" && *end != "none" {
		log.Fatalf("repro: -end %q: want late, together or none", *end)
	}

	cert, err := selfSigned()
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintln(w, "<!doctype html><title>repro</title>")
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		// Read the request body to its end first, as Sluice does (it
		// parses the JSON): otherwise quic-go answers the unread body
		// with STOP_SENDING when the handler returns, which Sluice never
		// sends, and the repro would differ from it in two ways at once.
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		stream(w, *end, *delay, *events, *gap)
	})

	h3 := &http3.Server{Addr: *addr, Handler: mux, TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}})}
	ln, err := tls.Listen("tcp", *addr, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(http.Serve(ln, mux)) }()
	log.Printf("repro: HTTP/3 on udp %s, -end %s -delay %s", *addr, *end, *delay)
	log.Fatal(h3.ListenAndServe())
}

// stream writes the SSE body and ends it as -end says.
func stream(w http.ResponseWriter, end string, delay time.Duration, events int, gap time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Server-Timing", "ttft;dur=1.000")
	if end != "none" {
		h["trailer"] = []string{"Server-Timing"} // as Sluice: not canonical, see proxy/timing.go
	}
	f := w.(http.Flusher)
	chunk := `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}` + "\n\n"
	for i := 0; i < events; i++ {
		fmt.Fprint(w, chunk)
		f.Flush()
		time.Sleep(gap)
	}
	fmt.Fprint(w, `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	f.Flush()
	fmt.Fprint(w, "data: [DONE]\n\n")
	switch end {
	case "late":
		f.Flush()
		time.Sleep(delay)
	case "none":
		return
	}
	h[http.TrailerPrefix+"Server-Timing"] = []string{"decode;dur=80.000"}
}

// selfSigned returns an in-memory ECDSA certificate for 127.0.0.1 and
// localhost.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "repro"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
