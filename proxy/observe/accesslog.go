package observe

import (
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// AccessLog writes one line per finished request, in the node's log format:
// a JSON object (format "json") or key=value pairs ("text"), with the same
// time, level and msg fields as the node's slog lines, so both kinds of
// line share one stream and one parser.
//
// It formats the line itself into a pooled buffer and writes it with one
// Write. slog's handlers cost ~10 µs and ~30 allocations per line here
// (they format every float through encoding/json); this costs ~1 µs and
// none. Durations are milliseconds with microsecond resolution.
type AccessLog struct {
	text bool
	mu   sync.Mutex // serialises writes: a line is never interleaved
	w    io.Writer
	lw   *LogWriter // w when it is one: its lines may be buffered
}

// NewAccessLog returns an access log writing to w in format "json" or
// "text" (anything else is JSON). When w is a *LogWriter, lines go through
// its buffer (LogWriter.SetBuffer).
func NewAccessLog(w io.Writer, format string) *AccessLog {
	lw, _ := w.(*LogWriter)
	return &AccessLog{w: w, lw: lw, text: format == "text"}
}

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// line is an access log line being built, in a buffer from lineBufs.
type line struct {
	bp    *[]byte
	b     []byte
	text  bool
	first bool
}

func (a *AccessLog) begin(t time.Time) line {
	bp := lineBufs.Get().(*[]byte)
	l := line{bp: bp, b: (*bp)[:0], text: a.text, first: true}
	if !l.text {
		l.b = append(l.b, '{')
	}
	l.b = appendLogTime(l.key("time"), t, l.text)
	l.raw("level", "INFO")
	l.str("msg", "request")
	return l
}

// end writes the line and returns its buffer to the pool.
func (a *AccessLog) end(l *line) {
	if !l.text {
		l.b = append(l.b, '}')
	}
	l.b = append(l.b, '\n')
	if a.lw != nil {
		a.lw.line(l.b) // serialised by the LogWriter
	} else {
		a.mu.Lock()
		a.w.Write(l.b) // a log that cannot be written must not fail the request
		a.mu.Unlock()
	}
	if cap(l.b) <= 64<<10 { // an outsized line's buffer is not kept
		*l.bp = l.b[:0]
		lineBufs.Put(l.bp)
	}
}

// key appends the separator and the key, and returns the buffer ready for
// the value.
func (l *line) key(k string) []byte {
	switch {
	case l.text && !l.first:
		l.b = append(l.b, ' ')
	case !l.text && !l.first:
		l.b = append(l.b, ',')
	}
	l.first = false
	if l.text {
		l.b = append(l.b, k...)
		return append(l.b, '=')
	}
	l.b = append(l.b, '"')
	l.b = append(l.b, k...)
	return append(l.b, '"', ':')
}

func (l *line) str(k, v string) {
	if l.text {
		l.b = appendTextString(l.key(k), v)
		return
	}
	l.b = appendJSONString(l.key(k), v)
}

// raw appends a value that needs no quoting in text and a string in JSON.
func (l *line) raw(k, v string) {
	if l.text {
		l.b = append(l.key(k), v...)
		return
	}
	l.b = append(append(append(l.key(k), '"'), v...), '"')
}

func (l *line) int(k string, v int64) { l.b = strconv.AppendInt(l.key(k), v, 10) }

func (l *line) boolean(k string, v bool) { l.b = strconv.AppendBool(l.key(k), v) }

// ms appends d in milliseconds with three decimals (microseconds).
func (l *line) ms(k string, d time.Duration) { l.b = appendMillis(l.key(k), d) }

func appendMillis(b []byte, d time.Duration) []byte {
	if d < 0 {
		b = append(b, '-')
		d = -d
	}
	us := (d + 500*time.Nanosecond) / time.Microsecond
	b = strconv.AppendInt(b, int64(us/1000), 10)
	frac := int(us % 1000)
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}

// appendLogTime appends t as slog's handlers do: RFC 3339 with nanoseconds,
// quoted, in JSON; with milliseconds, bare, in text.
func appendLogTime(b []byte, t time.Time, text bool) []byte {
	if !text {
		b = append(b, '"')
		b = t.AppendFormat(b, time.RFC3339Nano)
		return append(b, '"')
	}
	const prefix = len("2006-01-02T15:04:05.000")
	n := len(b)
	// RFC3339Nano trims trailing zeros: adding 0.1 ms keeps four digits,
	// and the fourth is dropped.
	b = t.Truncate(time.Millisecond).Add(time.Millisecond/10).AppendFormat(b, time.RFC3339Nano)
	return append(b[:n+prefix], b[n+prefix+1:]...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD, and U+2028
// and U+2029 escaped (as encoding/json does) so the line stays one line for
// JavaScript readers too.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendTextString appends s bare when it is a plain token, quoted (Go
// syntax, as slog's text handler does) when it is empty or holds spaces,
// quotes, '=' or anything outside printable ASCII.
func appendTextString(b []byte, s string) []byte {
	if s == "" {
		return append(b, '"', '"')
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '=' || c == '\\' {
			return strconv.AppendQuote(b, s)
		}
	}
	return append(b, s...)
}

// stageLogKeys are the access log keys of Timed ("auth_ms"), made once
// rather than per request.
var stageLogKeys = func() (keys [len(Timed)]string) {
	for i, s := range Timed {
		keys[i] = s + "_ms"
	}
	return keys
}()

// Write writes the request's line: ids, outcome, every stage, tokens,
// bytes. Keys and prompt text are never logged. A nil *AccessLog writes
// nothing.
func (a *AccessLog) Write(r *Record) {
	if a == nil {
		return
	}
	l := a.begin(r.End)
	l.str("request_id", r.ID)
	if r.TraceID != "" {
		l.raw("trace_id", r.TraceID)
	}
	l.str("client", r.Client)
	l.str("tenant", r.Tenant)
	l.str("method", r.Method)
	l.str("path", r.Path)
	l.str("proto", r.Proto)
	l.int("status", int64(r.Status))
	l.str("route", r.routeLabel())
	l.str("backend", r.Backend)
	l.str("model", r.Model)
	for i, d := range r.Stages {
		if r.Measured[i] {
			l.ms(stageLogKeys[i], d)
		}
	}
	l.ms("e2e_ms", r.End.Sub(r.Start))
	if p50, p99, _, n := ITLPercentiles(r.ITL); n > 0 {
		l.ms("itl_p50_ms", p50)
		l.ms("itl_p99_ms", p99)
	}
	l.int("tokens_in", r.Usage.InputTokens)
	l.int("tokens_out", r.Usage.OutputTokens)
	l.int("bytes_out", r.BytesOut)
	l.int("bytes_in", r.BytesIn)
	l.int("retries", int64(r.Retries))
	if r.Hedged {
		l.boolean("hedged", true)
	}
	if r.Decision.WouldRefuse {
		l.str("would_refuse", r.Decision.Reason)
	}
	l.str("error", r.Error)
	a.end(&l)
}
