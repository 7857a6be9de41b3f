package certs_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/sluice-proxy/sluice/internal/filewatch"
	"github.com/sluice-proxy/sluice/tls/certs"
)

// A TCP listener serving HTTP/1.1 and HTTP/2 with reloadable certificates.
func ExampleStore_TLSConfig() {
	store, err := certs.New(certs.Config{DevCert: true}, slog.Default(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Reload on file changes until ctx is done.
	w := filewatch.New(filewatch.Config{
		Dirs:  store.WatchDirs,
		Check: func(bool) { _ = store.Check() }, // failures are logged and counted
		Poll:  store.PollInterval(),
	})
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := &http.Server{TLSConfig: store.TLSConfig(), Handler: http.NotFoundHandler()}
	go srv.ServeTLS(ln, "", "") // file names empty: certificates come from TLSConfig
	defer srv.Close()

	fmt.Println(srv.TLSConfig.NextProtos, len(store.Pins()))
	// Output: [h2 http/1.1] 1
}
