package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAttackSmugglingHTTP1 sends the request heads that let a front proxy
// and Sluice disagree on where a request ends (request smuggling) over raw
// TCP, and requires 400 for each. Go's net/http (go1.26) refuses them
// itself: this test proves it, so an upgrade that loosens the parser fails
// here.
func TestAttackSmugglingHTTP1(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	addr := strings.TrimPrefix(e.http, "http://")
	body := `{"model":"sim-small","max_tokens":2,"messages":[]}`
	auth := "Authorization: Bearer " + testKey
	cases := map[string]string{
		"CL and TE": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body),
		"TE not chunked":  "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"two CL":          "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}",
		"obs-fold":        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
		"obs-fold CL":     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nContent-Length:\r\n 2\r\n\r\n{}",
		"bare LF":         "POST /v1/chat/completions HTTP/1.1\nHost: x\n" + auth + "\nContent-Length: 2\n\n{}",
		"bare LF in head": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\nContent-Length: 2\r\n\r\n{}",
		"bare LF chunked": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\n%s\n0\n\n", len(body), body),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			conn, br := rawConn(t, addr)
			if _, err := conn.Write([]byte(raw)); err != nil {
				t.Fatal(err)
			}
			st, msg := readStatus(t, conn, br, 5*time.Second)
			want := http.StatusBadRequest
			if name == "TE not chunked" {
				want = http.StatusNotImplemented // net/http: "Unsupported transfer encoding"
			}
			if st != want {
				t.Errorf("status %d %q; want %d", st, msg, want)
			}
		})
	}
}
