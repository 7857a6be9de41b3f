package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Workload names. Lengths are in tokens; MIN-MAX is uniform over the
// integers MIN..MAX, lognormal:M:S is exp(N(ln M, S²)) rounded and clamped.
//
//	chat       prompt lognormal:60:0.7:8:1024    output 100-300
//	translate  prompt 20-80                      output 20-80
//	batch      prompt lognormal:300:0.8:32:4096  output 800-1600
//	custom     prompt and output from Config.PromptTokens / OutputTokens
const (
	WorkloadChat      = "chat"
	WorkloadTranslate = "translate"
	WorkloadBatch     = "batch"
	WorkloadCustom    = "custom"
)

var workloads = map[string][2]Dist{
	WorkloadChat:      {{Kind: LogNormal, A: 60, B: 0.7, Min: 8, Max: 1024}, {Kind: Uniform, A: 100, B: 300}},
	WorkloadTranslate: {{Kind: Uniform, A: 20, B: 80}, {Kind: Uniform, A: 20, B: 80}},
	WorkloadBatch:     {{Kind: LogNormal, A: 300, B: 0.8, Min: 32, Max: 4096}, {Kind: Uniform, A: 800, B: 1600}},
}

// DistKind is the shape of a length distribution.
type DistKind string

// Distribution shapes.
const (
	Fixed     DistKind = "fixed"
	Uniform   DistKind = "uniform"
	LogNormal DistKind = "lognormal"
)

// Dist is a distribution of token counts. The zero Dist is unset.
type Dist struct {
	// Kind is the shape; empty means unset.
	Kind DistKind
	// A and B are the parameters: Fixed uses A; Uniform draws integers in
	// [A, B]; LogNormal has median A and log-space standard deviation B.
	A, B float64
	// Min and Max clamp a LogNormal draw; zero means 1 and 100 × median.
	Min, Max int
}

// ParseDist parses "N" (fixed), "MIN-MAX" (uniform, inclusive) or
// "lognormal:MEDIAN:SIGMA[:MIN:MAX]".
func ParseDist(s string) (Dist, error) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "lognormal:"); ok {
		return parseLogNormal(rest)
	}
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err := errors.Join(err1, err2); err != nil || a < 1 || b < a {
			return Dist{}, fmt.Errorf("uniform %q: want MIN-MAX with 1 <= MIN <= MAX", s)
		}
		return Dist{Kind: Uniform, A: float64(a), B: float64(b)}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return Dist{}, fmt.Errorf("length %q: want N, MIN-MAX or lognormal:MEDIAN:SIGMA[:MIN:MAX]", s)
	}
	return Dist{Kind: Fixed, A: float64(n)}, nil
}

func parseLogNormal(s string) (Dist, error) {
	f := strings.Split(s, ":")
	if len(f) != 2 && len(f) != 4 {
		return Dist{}, fmt.Errorf("lognormal %q: want MEDIAN:SIGMA[:MIN:MAX]", s)
	}
	var v [4]float64
	for i, x := range f {
		n, err := strconv.ParseFloat(x, 64)
		if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || n < 0 {
			return Dist{}, fmt.Errorf("lognormal %q: bad number %q", s, x)
		}
		v[i] = n
	}
	d := Dist{Kind: LogNormal, A: v[0], B: v[1], Min: int(v[2]), Max: int(v[3])}
	if d.A < 1 || (len(f) == 4 && (d.Min < 1 || d.Max < d.Min)) {
		return Dist{}, fmt.Errorf("lognormal %q: want MEDIAN >= 1 and 1 <= MIN <= MAX", s)
	}
	return d, nil
}

// String formats d in the syntax ParseDist reads.
func (d Dist) String() string {
	switch d.Kind {
	case Fixed:
		return strconv.Itoa(int(d.A))
	case Uniform:
		return fmt.Sprintf("%d-%d", int(d.A), int(d.B))
	case LogNormal:
		if d.Min == 0 && d.Max == 0 {
			return fmt.Sprintf("lognormal:%g:%g", d.A, d.B)
		}
		return fmt.Sprintf("lognormal:%g:%g:%d:%d", d.A, d.B, d.Min, d.Max)
	}
	return ""
}

// Set implements flag.Value.
func (d *Dist) Set(s string) error {
	v, err := ParseDist(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Draw returns one length from d using r; always >= 1.
func (d Dist) Draw(r *rand.Rand) int {
	switch d.Kind {
	case Uniform:
		lo, hi := int(d.A), int(d.B)
		return lo + r.IntN(hi-lo+1)
	case LogNormal:
		lo, hi := d.Min, d.Max
		if lo < 1 {
			lo = 1
		}
		if hi < lo {
			hi = max(lo, int(100*d.A))
		}
		v := int(math.Round(d.A * math.Exp(d.B*r.NormFloat64())))
		return min(max(v, lo), hi)
	}
	return max(int(d.A), 1)
}

// workload turns a sequence number into a request body, deterministically:
// request seq of a run with a given seed is the same on every target and
// every sweep point.
type workload struct {
	seed            uint64
	prompt, output  Dist
	model           string
	completionsBody bool // "prompt" instead of "messages"
	stream          bool
	ignoreEOS       bool
}

// job is one request to send.
type job struct {
	Seq          int64
	PromptTokens int
	MaxTokens    int
	Body         []byte
}

func newWorkload(c Config) (*workload, error) {
	dists, known := workloads[c.Workload]
	if !known && c.Workload != WorkloadCustom {
		return nil, fmt.Errorf("unknown workload %q (want chat, translate, batch or custom)", c.Workload)
	}
	if c.PromptTokens.Kind != "" {
		dists[0] = c.PromptTokens
	}
	if c.OutputTokens.Kind != "" {
		dists[1] = c.OutputTokens
	}
	if dists[0].Kind == "" || dists[1].Kind == "" {
		return nil, errors.New("custom needs both prompt-tokens and output-tokens")
	}
	return &workload{
		seed:            uint64(c.Seed),
		prompt:          dists[0],
		output:          dists[1],
		model:           c.Model,
		completionsBody: strings.HasSuffix(c.Path, "/completions") && !strings.HasSuffix(c.Path, "/chat/completions"),
		stream:          !c.NoStream,
		ignoreEOS:       c.IgnoreEOS,
	}, nil
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// job builds request number seq.
func (w *workload) job(seq int64) job {
	r := rand.New(rand.NewPCG(w.seed, uint64(seq)))
	j := job{Seq: seq, PromptTokens: w.prompt.Draw(r), MaxTokens: w.output.Draw(r)}
	body := requestBody{Model: w.model, MaxTokens: j.MaxTokens, Stream: w.stream, IgnoreEOS: w.ignoreEOS}
	if w.stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	text := promptText(r, j.PromptTokens)
	if w.completionsBody {
		body.Prompt = text
	} else {
		body.Messages = []chatMessage{{Role: "user", Content: text}}
	}
	j.Body, _ = json.Marshal(body) // cannot fail: plain strings and ints
	return j
}

// promptWords are common English words that most tokenizers encode as one
// token each (with the leading space), so n words ≈ n prompt tokens.
var promptWords = strings.Fields(`the of and to in is you that it he was for on are as
with his they at be this have from or one had by word but not what all were we when
your can said there use an each which she do how their if will up other about out many
then them these so some her would make like him into time has look two more write go
see number no way could people my than first water been call who oil its now find long
down day did get come made may part over new sound take only little work know place
year live me back give most very after thing our just name good sentence man think say
great where help through much before line right too mean old any same tell boy follow
came want show also around form three small set put end does another well large must
big even such because turn here why ask went men read need land different home us move
try kind hand picture again change off play spell air away animal house point page
letter mother answer found study still learn should world high every near add food
between own below country plant last school father keep tree never start city earth eye
light thought head under story saw left few while along might close something seem next
hard open example begin life always those both paper together got group often run`)

func promptText(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 6)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(promptWords[r.IntN(len(promptWords))])
	}
	return b.String()
}
