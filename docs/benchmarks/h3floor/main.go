// Command h3floor measures quic-go's floor for docs/BENCHMARKS.md, "h3cpu8":
// the simulator (internal/gpusim, the same handler `sluice sim` serves)
// served in one process over HTTP/1.1 (cleartext TCP) and over HTTP/3
// (quic-go's own http3.Server and response writer, Sluice's quic.Config),
// so that `sluice bench -pid` of this process over each protocol gives
// what a plain quic-go server costs per token against the same server's
// TCP path, with no proxy in between.
//
//	go run ./docs/benchmarks/h3floor -h1 127.0.0.1:PORT -h3 127.0.0.1:PORT [sim flags]
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	_ "net/http/pprof" // -pprof
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

func main() {
	fs := flag.NewFlagSet("h3floor", flag.ExitOnError)
	h1 := fs.String("h1", "127.0.0.1:0", "HTTP/1.1 listen `address`")
	h3 := fs.String("h3", "127.0.0.1:0", "HTTP/3 (UDP) listen `address`")
	pprof := fs.String("pprof", "", "serve /debug/pprof on this `address` (none when empty)")
	var cfg gpusim.Config
	cfg.RegisterFlags(fs)
	fs.Parse(os.Args[1:])
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *pprof != "" {
		go http.ListenAndServe(*pprof, nil) // the default mux: net/http/pprof
	}
	sim := gpusim.New(cfg)
	defer sim.Close()

	ln, err := net.Listen("tcp", *h1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go (&http.Server{Handler: sim}).Serve(ln)

	pc, err := net.ListenPacket("udp", *h3)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tr := &quic.Transport{Conn: pc}
	qln, err := tr.Listen(http3.ConfigureTLSConfig(selfSigned()), &quic.Config{
		MaxIncomingStreams: 100, // Sluice's listener's defaults (proxy/listen/http3.go)
		MaxIdleTimeout:     2 * time.Minute,
		KeepAlivePeriod:    15 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go (&http3.Server{Handler: sim}).ServeListener(qln)
	fmt.Printf("h1 http://%s h3 https://%s\n", ln.Addr(), pc.LocalAddr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}

func selfSigned() *tls.Config {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}
