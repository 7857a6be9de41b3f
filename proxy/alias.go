package proxy

import (
	"bytes"
	"encoding/json"
	"io"

	"github.com/sluice-proxy/sluice/routing"
)

// Model aliases (routes' served_models): a tenant asks for a public name,
// routing, limits, metrics and the access log use it, the backend gets the
// name its pool serves, and the client gets the public name back in every
// "model" member of the response (stream events, non-streamed bodies, the
// WebSocket bridge's frames, which carry the same events).

// alias is one request's model alias. A nil *alias restores nothing: the
// per-event cost of a request without an alias is one nil check.
type alias struct {
	public, served string
	// servedQ and publicQ are the names as JSON strings, with their
	// quotes, as encoding/json writes them without HTML escaping: "/" and
	// non-ASCII unescaped, as vLLM's pydantic (model_dump_json) and serde
	// (TGI) write them. A backend that escapes the served name (Python's
	// json.dumps with ensure_ascii, "\/") is not matched: its answers
	// keep the served name.
	servedQ, publicQ []byte
	// tail is servedQ without its opening quote: what restore searches
	// for (a name's first byte is rarer in JSON than a quote, so
	// bytes.Index skips ahead faster).
	tail []byte
	// buf holds the last event restore changed, reused for the next.
	buf []byte
}

// newAlias returns the alias of a request for public served as served.
func newAlias(public, served string) *alias {
	a := &alias{public: public, served: served, servedQ: jsonString(served), publicQ: jsonString(public)}
	a.tail = a.servedQ[1:]
	return a
}

// jsonString is s as a JSON string without HTML escaping.
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// applyAlias rewrites the model of a parsed request whose route serves it
// under another name: the model member's value (its span from the intake,
// escapes included) is replaced by the served name, the rest of the body
// is kept byte for byte, and x.alias is set so that the responses name the
// public model again. x.meta.Model stays the public name.
func (x *exchange) applyAlias(route *routing.Route) {
	served, ok := route.ServedModels[x.meta.Model]
	if !ok || x.meta.modelEnd == 0 {
		return
	}
	x.alias = newAlias(x.meta.Model, served)
	x.body = replaceSpan(x.body, x.meta.modelAt, x.meta.modelEnd, x.alias.servedQ)
	if shift := len(x.alias.servedQ) - (x.meta.modelEnd - x.meta.modelAt); x.meta.promptAt >= x.meta.modelEnd {
		x.meta.promptAt += shift // the prompt's span (prefix affinity) follows the edit
		x.meta.promptEnd += shift
	}
	x.meta.modelEnd = x.meta.modelAt + len(x.alias.servedQ)
}

// replaceSpan returns a new body with body[at:end] replaced by with.
func replaceSpan(body []byte, at, end int, with []byte) []byte {
	out := make([]byte, 0, len(body)-(end-at)+len(with))
	out = append(out, body[:at]...)
	out = append(out, with...)
	return append(out, body[end:]...)
}

// restore returns ev with the served name replaced by the public one in
// every "model" member whose value it is. ev is returned as is when it
// does not hold the served name (one bytes.Index); otherwise the result is
// a buffer of a's, valid until the next call. Safe on a nil *alias.
func (a *alias) restore(ev []byte) []byte {
	if a == nil {
		return ev
	}
	k := bytes.Index(ev, a.tail)
	if k < 0 {
		return ev
	}
	out, changed := a.appendRestored(a.buf[:0], ev, 0, k)
	if !changed {
		return ev
	}
	a.buf = out
	return out
}

// restoreBody returns body with the alias restored, in a new slice when it
// changed. Safe on a nil *alias.
func (a *alias) restoreBody(body []byte) []byte {
	if a == nil {
		return body
	}
	k := bytes.Index(body, a.tail)
	if k < 0 {
		return body
	}
	out, changed := a.appendRestored(nil, body, 0, k)
	if !changed {
		return body
	}
	return out
}

// appendRestored appends data[from:] to dst with every model member's
// served value replaced by the public name; data[:from] is context only
// (what precedes the value, for isModelValue). first is where a search of
// a.tail in data[from:] found it first.
func (a *alias) appendRestored(dst, data []byte, from, first int) ([]byte, bool) {
	changed := false
	last := from
	for i := max(from+1, first); i <= len(data); {
		j := bytes.Index(data[i:], a.tail)
		if j < 0 {
			break
		}
		at := i + j - 1 // the opening quote's place
		if data[at] == '"' && isModelValue(data, at) {
			dst = append(dst, data[last:at]...)
			dst = append(dst, a.publicQ...)
			last = at + len(a.servedQ)
			changed = true
			i = last + 1
		} else {
			i = at + 2 // past this tail's first byte
		}
	}
	return append(dst, data[last:]...), changed
}

// modelKey is the member name whose value restore replaces.
var modelKey = []byte(`"model"`)

// isModelValue reports whether the string starting at data[at] (its
// opening quote) is the value of a "model" member: preceded, whitespace
// aside, by a colon, the key "model", and the "{" or "," before the key.
// A quote inside a string is escaped, so the unescaped quote at data[at]
// starts a string, and the key check excludes values of other members
// and text that merely contains the name.
func isModelValue(data []byte, at int) bool {
	i := skipSpaceBack(data, at)
	if i < 1 || data[i-1] != ':' {
		return false
	}
	i = skipSpaceBack(data, i-1)
	if i < len(modelKey) || !bytes.Equal(data[i-len(modelKey):i], modelKey) {
		return false
	}
	i = skipSpaceBack(data, i-len(modelKey))
	return i >= 1 && (data[i-1] == '{' || data[i-1] == ',')
}

// skipSpaceBack returns the index after the last non-space byte before i.
func skipSpaceBack(data []byte, i int) int {
	for i > 0 {
		switch data[i-1] {
		case ' ', '\t', '\n', '\r':
			i--
		default:
			return i
		}
	}
	return i
}

// maxLookBehind bounds what restoreWriter keeps of what it has written, as
// context for isModelValue: `,"model":` with up to 48 bytes of whitespace.
const maxLookBehind = 64

// restoreWriter writes a body to w with the alias restored, as it arrives
// in any number of writes: a served name split across writes is held back
// (at most its length minus one byte) until the next write or Close, so a
// "model" member is restored wherever the reads cut it. It is for a
// non-streamed body relayed as it is read (today passThrough has the whole
// body and calls restoreBody; a relay that streams the body wraps its
// writer in newRestoreWriter(x.alias, w), calls Close at the end, and
// drops Content-Length when x.alias is set, since the length changes).
// Events of a stream are whole and go through alias.restore. A nil alias
// writes through unchanged.
type restoreWriter struct {
	a *alias
	w io.Writer
	// buf is [look-behind | pending]: keep is where the bytes not yet
	// written start; before it, up to maxLookBehind bytes already written.
	buf  []byte
	keep int
	out  []byte
}

// newRestoreWriter returns a writer restoring a's public name into what it
// writes to w.
func newRestoreWriter(a *alias, w io.Writer) *restoreWriter { return &restoreWriter{a: a, w: w} }

// Write restores and writes what of p can no longer be part of a served
// name, holding back the rest. It returns len(p) unless w failed.
func (r *restoreWriter) Write(p []byte) (int, error) {
	if r.a == nil {
		return r.w.Write(p)
	}
	r.buf = append(r.buf, p...)
	// Bytes from safe on could start a served name that the next write
	// completes.
	safe := max(r.keep, len(r.buf)-(len(r.a.servedQ)-1))
	out := r.out[:0]
	last := r.keep
	for i := r.keep; i < safe; {
		j := bytes.Index(r.buf[i:], r.a.servedQ)
		if j < 0 || i+j >= safe {
			break
		}
		at := i + j
		if isModelValue(r.buf, at) {
			out = append(out, r.buf[last:at]...)
			out = append(out, r.a.publicQ...)
			last = at + len(r.a.servedQ)
			i = last
		} else {
			i = at + 1
		}
	}
	end := max(safe, last) // a replaced name may end past safe
	out = append(out, r.buf[last:end]...)
	r.keep = end
	r.out = out
	if drop := r.keep - maxLookBehind; drop > 0 {
		n := copy(r.buf, r.buf[drop:])
		r.buf = r.buf[:n]
		r.keep -= drop
	}
	if len(out) > 0 {
		if _, err := r.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close writes the bytes held back (it does not close w).
func (r *restoreWriter) Close() error {
	if r.a == nil || r.keep == len(r.buf) {
		return nil
	}
	rest := r.buf[r.keep:]
	r.keep = len(r.buf)
	_, err := r.w.Write(rest)
	return err
}
