package gpusim

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestServe(t *testing.T) {
	s := New(fast())
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":3,"stream":true}`)
	if _, done, err := readEvents(t, resp.Body); !done || err != nil {
		t.Errorf("done=%v err=%v", done, err)
	}
	resp.Body.Close()

	// HTTP/2 without TLS (prior knowledge): streaming, and die-after as a
	// stream reset.
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &h2c}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, die := range []string{"0", "2"} {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", stringsReader(chatBody(4, true, false)))
		req.Header.Set(HeaderDieAfter, die)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ProtoMajor != 2 {
			t.Errorf("protocol %s; want HTTP/2", resp.Proto)
		}
		evs, done, err := readEvents(t, resp.Body)
		resp.Body.Close()
		if die == "0" && (!done || err != nil || len(evs) != 6) {
			t.Errorf("h2c stream: %d events done=%v err=%v", len(evs), done, err)
		}
		if die == "2" && (done || err == nil || len(evs) != 3) {
			t.Errorf("h2c die-after 2: %d events done=%v err=%v; want 3 events and a reset", len(evs), done, err)
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Error("still serving after cancel")
	}
}

func TestListenAndServe(t *testing.T) {
	if err := ListenAndServe(context.Background(), "127.0.0.1:0", Config{MaxBatch: -3}); err == nil {
		t.Error("invalid config accepted")
	}
	// Find a free port, then serve on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ListenAndServe(ctx, addr, Config{}) }()
	eventually(t, "the server to answer /health", func() bool {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(body) == "ok"
	})
	cancel()
	if err := <-served; err != nil {
		t.Errorf("ListenAndServe: %v", err)
	}
}
