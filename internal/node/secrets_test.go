package node

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// authRecorder is a real simulated engine (gpusim) behind a loopback
// listener that records the Authorization header of every generation
// request it serves.
type authRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (a *authRecorder) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) == 0 {
		return ""
	}
	return a.seen[len(a.seen)-1]
}

func startAuthBackend(t *testing.T) (*authRecorder, string) {
	t.Helper()
	sim := gpusim.New(gpusim.Config{Model: "sim-small", MaxBatch: 16, StepBase: time.Millisecond, PrefillBase: time.Millisecond}.WithDefaults())
	rec := &authRecorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/chat/") {
			rec.mu.Lock()
			rec.seen = append(rec.seen, r.Header.Get("Authorization"))
			rec.mu.Unlock()
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		sim.Close()
	})
	return rec, srv.URL
}

// A pool's api_key read from a file reaches the backend as Authorization;
// after the file is rotated and the node reloaded, the new key is sent;
// neither key is ever shown by /debug/config (JSON or YAML) or in the
// reload's answer.
func TestPoolAPIKeyFileRotatesOnReload(t *testing.T) {
	rec, url := startAuthBackend(t)
	const keyOne, keyTwo = "sk-backend-key-one", "sk-backend-key-two"
	cfg := nodeConfig{Pools: "  - name: p\n    api_key_file: pool.key\n    dialect: none\n    backends: [{url: \"" + url + "\"}]\n"}.String()
	tn := startFileNode(t, cfg, "pool.key", keyOne+"\n")

	ask := func(want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if r := stream(ctx, tn.base, key1, "sim-small", 4); r.err != nil || r.status != 200 || !r.done {
			t.Fatalf("request: %+v", r)
		}
		if got := rec.last(); got != "Bearer "+want {
			t.Fatalf("backend saw Authorization %q; want %q", got, "Bearer "+want)
		}
	}
	noKeys := func(where, text string) {
		t.Helper()
		for _, k := range []string{keyOne, keyTwo} {
			if strings.Contains(text, k) {
				t.Fatalf("%s shows %q:\n%s", where, k, text)
			}
		}
	}
	ask(keyOne)
	noKeys("/debug/config?format=yaml", tn.get(tn.admin+"/debug/config?format=yaml"))
	noKeys("/debug/config", tn.get(tn.admin+"/debug/config"))

	tn.write("pool.key", keyTwo+"\n")
	code, res := tn.postReload()
	if code != 200 || res.Result != ResultOK || !contains(res.Changes, `pools: ~ changed "p": api_key (changed)`) {
		t.Fatalf("reload after rotating the key file: %d %+v", code, res)
	}
	noKeys("the reload's answer", strings.Join(res.Changes, "\n"))
	ask(keyTwo)
	noKeys("/debug/config?format=yaml", tn.get(tn.admin+"/debug/config?format=yaml"))
	noKeys("/debug/config", tn.get(tn.admin+"/debug/config"))
	noKeys("the node's log", tn.logs.String())

	// A key file that disappears is a config error: the node keeps the
	// key it has.
	tn.write("sluice.yaml", strings.Replace(cfg, "pool.key", "gone.key", 1))
	code, res = tn.postReload()
	if res.Result != ResultInvalid || len(res.Errors) != 1 || !strings.Contains(res.Errors[0], "sluice.yaml:") ||
		!strings.Contains(res.Errors[0], "pools[0].api_key_file: open ") {
		t.Fatalf("reload with a missing key file: %d %+v", code, res)
	}
	ask(keyTwo)
}

// redis.password_file authenticates the node to a real redis-server (an
// ACL user whose password is only in the file): the node's connections
// show up as that user in CLIENT LIST, and /debug/config never shows the
// password.
func TestRedisPasswordFromFile(t *testing.T) {
	srv := redistest.Start(t)
	const pw = "redis-acl-password-from-file"
	if r, err := srv.Do("ACL", "SETUSER", "sluice-edge", "on", ">"+pw, "~*", "&*", "+@all"); err != nil || r != "OK" {
		t.Fatalf("ACL SETUSER: %q %v", r, err)
	}
	cfg := nodeConfig{}.String() + "redis:\n  addrs: [\"" + srv.Addr() + "\"]\n  username: sluice-edge\n  password_file: redis.pw\n"
	tn := startFileNode(t, cfg, "redis.pw", pw+"\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r := stream(ctx, tn.base, key1, "sim-small", 4); r.err != nil || r.status != 200 || !r.done {
		t.Fatalf("request: %+v", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		list, err := srv.Do("CLIENT", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(list, "user=sluice-edge") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection authenticated as sluice-edge:\n%s\nnode log:\n%s", list, tn.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if y := tn.get(tn.admin + "/debug/config?format=yaml"); strings.Contains(y, pw) || !strings.Contains(y, "password_file: redis.pw") {
		t.Fatalf("/debug/config?format=yaml:\n%s", y)
	}
	if strings.Contains(tn.logs.String(), pw) {
		t.Fatal("the node's log shows the password")
	}
}
