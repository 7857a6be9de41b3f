package loadgen

import (
	"encoding/json"
	"flag"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestRegisterFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{
		"-target", "https://127.0.0.1:8443", "-compare", "http://127.0.0.1:9000", "-protocol", "h2",
		"-compare-protocol", "h1", "-path", "/v1/completions", "-api-key", "k", "-model", "m",
		"-no-stream", "-ignore-eos", "-header", "X-A: 1", "-header", "X-B: 2", "-insecure",
		"-workload", "custom", "-prompt-tokens", "10-20", "-output-tokens", "lognormal:100:0.5:10:400",
		"-seed", "9", "-concurrency", "8", "-rate", "2.5", "-duration", "3s", "-requests", "50",
		"-warmup", "1s", "-timeout", "9s", "-drain", "4s", "-max-inflight", "77", "-rounds", "6",
		"-pid", "1,2", "-pid", "3", "-sweep", "rate=1,2.5", "-json", "o.json", "-csv", "-",
		"-requests-csv", "r.csv", "-svg", "c.svg", "-progress", "never", "-ws-conns", "3", "-ws-path", "/ws",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Target: "https://127.0.0.1:8443", Compare: "http://127.0.0.1:9000", Protocol: H2, CompareProtocol: H1,
		Path: "/v1/completions", WSPath: "/ws", WSConns: 3, APIKey: "k", Model: "m", NoStream: true, IgnoreEOS: true,
		Headers: []string{"X-A: 1", "X-B: 2"}, Insecure: true, Workload: "custom",
		PromptTokens: Dist{Kind: Uniform, A: 10, B: 20},
		OutputTokens: Dist{Kind: LogNormal, A: 100, B: 0.5, Min: 10, Max: 400},
		Seed:         9, Concurrency: 8, Rate: 2.5, Duration: 3 * time.Second, Requests: 50, Warmup: time.Second,
		Timeout: 9 * time.Second, Drain: 4 * time.Second, MaxInFlight: 77, Rounds: 6, PIDs: []int{1, 2, 3},
		Sweep: SweepSpec{Kind: SweepRate, Values: []float64{1, 2.5}}, JSON: "o.json", CSV: "-",
		RequestsCSV: "r.csv", SVG: "c.svg", Progress: "never",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("parsed config\n got %+v\nwant %+v", c, want)
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Target: "http://127.0.0.1:8080"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no target", func(c *Config) { c.Target = "" }, "target: no URL"},
		{"h2 needs https", func(c *Config) { c.Protocol = H2 }, "protocol h2 needs a https URL"},
		{"h3 needs https", func(c *Config) { c.Protocol = H3 }, "protocol h3 needs a https URL"},
		{"h2c needs http", func(c *Config) { c.Target, c.Protocol = "https://127.0.0.1", H2C }, "protocol h2c needs a http URL"},
		{"compare protocol", func(c *Config) { c.Compare, c.CompareProtocol = "http://127.0.0.1:1", H3 }, "compare: protocol h3"},
		{"sweep with compare", func(c *Config) {
			c.Compare, c.Sweep = "http://127.0.0.1:1", SweepSpec{Kind: SweepRate, Values: []float64{1}}
		}, "cannot be combined"},
		{"unknown workload", func(c *Config) { c.Workload = "poetry" }, "unknown workload"},
		{"custom without lengths", func(c *Config) { c.Workload = WorkloadCustom }, "custom needs both"},
		{"negative", func(c *Config) { c.Concurrency = -1 }, "must not be negative"},
		{"bad header", func(c *Config) { c.Headers = []string{"nocolon"} }, "not \"Name: value\""},
		{"bad pin", func(c *Config) { c.PinSHA256 = "abc" }, "pin:"},
		{"bad path", func(c *Config) { c.Path = "v1/chat" }, "must start with /"},
		{"bad progress", func(c *Config) { c.Progress = "sometimes" }, "progress"},
		{"bad pid", func(c *Config) { c.PIDs = []int{0} }, "not a process id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c := Config{Target: "http://x"}.withDefaults()
	if c.Duration != DefaultDuration || c.Concurrency != 1 || c.Protocol != H1 || c.Path != DefaultPath ||
		c.Workload != WorkloadChat || c.Seed != 1 || c.Timeout != DefaultTimeout {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c := (Config{Target: "http://x", Requests: 5}).withDefaults(); c.Duration != 0 {
		t.Errorf("duration defaulted although requests bound the run: %v", c.Duration)
	}
}

func TestParseDist(t *testing.T) {
	for _, s := range []string{"200", "100-300", "lognormal:60:0.7", "lognormal:60:0.7:8:1024"} {
		d, err := ParseDist(s)
		if err != nil {
			t.Fatalf("ParseDist(%q): %v", s, err)
		}
		if d.String() != s {
			t.Errorf("ParseDist(%q).String() = %q", s, d.String())
		}
	}
	for _, s := range []string{"", "0", "-5", "300-100", "a-b", "lognormal:", "lognormal:0:1", "lognormal:5:1:9:2", "lognormal:5:x"} {
		if _, err := ParseDist(s); err == nil {
			t.Errorf("ParseDist(%q) succeeded; want an error", s)
		}
	}
}

func TestDistDrawBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	u := Dist{Kind: Uniform, A: 100, B: 300}
	ln := Dist{Kind: LogNormal, A: 60, B: 0.7, Min: 8, Max: 1024}
	var sawLo, sawHi bool
	var below, above int
	for range 20000 {
		v := u.Draw(r)
		if v < 100 || v > 300 {
			t.Fatalf("uniform draw %d outside 100..300", v)
		}
		sawLo, sawHi = sawLo || v == 100, sawHi || v == 300
		w := ln.Draw(r)
		if w < 8 || w > 1024 {
			t.Fatalf("lognormal draw %d outside 8..1024", w)
		}
		if w < 60 {
			below++
		} else if w > 60 {
			above++
		}
	}
	if !sawLo || !sawHi {
		t.Error("uniform draws never reached an end of the range (not inclusive?)")
	}
	if ratio := float64(below) / float64(above); ratio < 0.9 || ratio > 1.1 {
		t.Errorf("lognormal median off: %d below 60, %d above", below, above)
	}
}

func TestWorkloadJobs(t *testing.T) {
	cfg := Config{Target: "http://x", Workload: WorkloadTranslate, Seed: 3}.withDefaults()
	w, err := newWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := w.job(17), w.job(17)
	if string(a.Body) != string(b.Body) {
		t.Error("the same seq gave different bodies")
	}
	if string(w.job(18).Body) == string(a.Body) {
		t.Error("different seqs gave the same body")
	}
	var body struct {
		Model         string `json:"model"`
		MaxTokens     int    `json:"max_tokens"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Messages []chatMessage `json:"messages"`
	}
	if err := json.Unmarshal(a.Body, &body); err != nil {
		t.Fatal(err)
	}
	words := len(strings.Fields(body.Messages[0].Content))
	if body.Model != DefaultModel || body.MaxTokens != a.MaxTokens || !body.Stream || !body.StreamOptions.IncludeUsage ||
		words != a.PromptTokens || a.MaxTokens < 20 || a.MaxTokens > 80 {
		t.Errorf("job %+v decoded as %+v (%d words)", a, body, words)
	}
	cfg.Path = "/v1/completions"
	w2, _ := newWorkload(cfg)
	if j := w2.job(1); !strings.Contains(string(j.Body), `"prompt":`) || strings.Contains(string(j.Body), `"messages"`) {
		t.Errorf("completions body: %s", j.Body)
	}
}
