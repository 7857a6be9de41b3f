package tracing

import (
	"net/http"

	"go.opentelemetry.io/otel/trace"
)

// Sluice's own W3C Trace Context handling, for the lean recorder: the
// propagator's Extract and Inject (propagation.TraceContext) cost a
// context, a boxed span, a parsed tracestate and two strings per request;
// these do the same without allocating. The rules are those of W3C Trace
// Context Level 1 (https://www.w3.org/TR/trace-context-1/; sections cited
// by their titles), as
// propagation.TraceContext (otel v1.47.0, propagation/trace_context.go)
// and trace.ParseTraceState (trace/tracestate.go) apply them:
// TestParentMatchesPropagator and FuzzParentMatchesPropagator run the
// same headers through both. Where the propagator picks one reading of
// the spec, this one picks the same, so that a trace continues exactly as
// it did:
//
//   - Only the first traceparent and the first tracestate field are read
//     ("tracestate Header Field Values" asks to combine repeated tracestate
//     fields; the propagator reads the first).
//   - A version-00 traceparent whose flags set bits other than sampled
//     (0x01) and random (0x02, Level 2) is rejected; of the flags only
//     those two are kept.
//   - The tracestate is passed on whole (no truncation: "tracestate
//     Limits" only asks to pass at least 512 characters), as its list-members after parsing,
//     so a list with empty members or optional white space is passed on
//     without them; an invalid tracestate is dropped, the traceparent kept
//     ("Tracestate Header": failure to parse tracestate MUST NOT affect
//     the parsing of traceparent).

// unhex maps a lower-case hex digit to its value, anything else to 0xff
// ("traceparent Header Field Values": the fields are HEXDIGLC).
var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

// decodeHex decodes 2*len(dst) lower-case hex digits of s into dst.
func decodeHex(dst []byte, s string) bool {
	bad := byte(0)
	for i := range dst {
		hi, lo := unhex[s[2*i]], unhex[s[2*i+1]]
		dst[i] = hi<<4 | lo
		bad |= hi | lo
	}
	return bad&0xf0 == 0 // no digit's value has the high bits set
}

// parseTraceparent parses a traceparent field value (W3C Trace Context
// Level 1, "traceparent Header Field Values"):
//
//	version "-" trace-id "-" parent-id "-" trace-flags
//	2 hex     32 hex       16 hex        2 hex
//
// Version 00 is exactly 55 characters ("version-format": these four
// fields, no more). A later version is parsed by its first 55
// characters, which must be followed by the end or a "-" ("Versioning of
// traceparent": "If a higher version is detected"); the rest is ignored.
// Version ff is invalid ("version"), and so are an all-zero trace-id
// ("trace-id") or parent-id ("parent-id") and any upper-case or non-hex
// digit. The flags kept are sampled and random.
func parseTraceparent(v string) (tid trace.TraceID, sid trace.SpanID, flags trace.TraceFlags, ok bool) {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return tid, sid, 0, false
	}
	var ver, fl [1]byte
	if !decodeHex(ver[:], v[0:2]) || ver[0] == 0xff {
		return tid, sid, 0, false
	}
	if len(v) > 55 && (ver[0] == 0 || v[55] != '-') {
		return tid, sid, 0, false
	}
	if !decodeHex(tid[:], v[3:35]) || !decodeHex(sid[:], v[36:52]) || !decodeHex(fl[:], v[53:55]) {
		return trace.TraceID{}, trace.SpanID{}, 0, false
	}
	if ver[0] == 0 && fl[0] > 3 || !tid.IsValid() || !sid.IsValid() {
		return trace.TraceID{}, trace.SpanID{}, 0, false
	}
	return tid, sid, trace.TraceFlags(fl[0]) & (trace.FlagsSampled | trace.FlagsRandom), true
}

// remoteParent is the span context of h's traceparent and the tracestate
// to continue with it, or an invalid span context when h has no valid
// traceparent.
func remoteParent(h http.Header) (trace.SpanContext, string) {
	tp := h["Traceparent"]
	if len(tp) == 0 {
		return trace.SpanContext{}, ""
	}
	tid, sid, flags, ok := parseTraceparent(tp[0])
	if !ok {
		return trace.SpanContext{}, ""
	}
	var ts string
	if v := h["Tracestate"]; len(v) > 0 {
		ts = tracestateOf(v[0])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, Remote: true}), ts
}

// tracestateOf is the tracestate to pass on for a received value: v
// itself when it is already a valid list as the propagator would write it
// back (the common case: no allocation), else what the propagator makes of
// it (trace.ParseTraceState, then String: "" when v is invalid).
func tracestateOf(v string) string {
	if v == "" || canonicalTracestate(v) {
		return v
	}
	ts, err := trace.ParseTraceState(v)
	if err != nil {
		return ""
	}
	return ts.String()
}

// maxMembers is the most list-members a tracestate may have
// ("tracestate Header Field Values": 32).
const maxMembers = 32

// canonicalTracestate reports whether v is a valid tracestate ("list",
// "Key", "Value") with no empty list-member
// and no optional white space, at most 32 list-members, no key twice: the
// form trace.TraceState.String writes, so that v is what the propagator
// would pass on. false says only "not in that form": tracestateOf then
// asks trace.ParseTraceState.
func canonicalTracestate(v string) bool {
	var keys [maxMembers]string
	n := 0
	for start := 0; start <= len(v); {
		end := start
		for end < len(v) && v[end] != ',' {
			end++
		}
		m := v[start:end]
		eq := 0
		for eq < len(m) && m[eq] != '=' {
			eq++
		}
		if eq == len(m) || n == maxMembers || !tracestateKey(m[:eq]) || !tracestateValue(m[eq+1:]) {
			return false
		}
		for _, k := range keys[:n] {
			if k == m[:eq] {
				return false
			}
		}
		keys[n] = m[:eq]
		n++
		start = end + 1
	}
	return true
}

// keyChar reports whether c may follow a key's first character:
// lcalpha / DIGIT / "_" / "-" / "*" / "/".
func keyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '*' || c == '/'
}

// tracestateKey reports whether k is a key (Level 1 "Key"):
//
//	simple-key       = lcalpha 0*255( keychar )
//	multi-tenant-key = tenant-id "@" system-id
//	tenant-id        = ( lcalpha / DIGIT ) 0*240( keychar )
//	system-id        = lcalpha 0*13( keychar )
func tracestateKey(k string) bool {
	at := -1
	for i := 0; i < len(k); i++ {
		if k[i] == '@' {
			at = i
			break
		}
	}
	rest := func(s string, n int) bool {
		if len(s) > n {
			return false
		}
		for i := 0; i < len(s); i++ {
			if !keyChar(s[i]) {
				return false
			}
		}
		return true
	}
	lcalpha := func(c byte) bool { return 'a' <= c && c <= 'z' }
	if at < 0 {
		return len(k) > 0 && lcalpha(k[0]) && rest(k[1:], 255)
	}
	tenant, system := k[:at], k[at+1:]
	return len(tenant) > 0 && (lcalpha(tenant[0]) || '0' <= tenant[0] && tenant[0] <= '9') && rest(tenant[1:], 240) &&
		len(system) > 0 && lcalpha(system[0]) && rest(system[1:], 13)
}

// tracestateValue reports whether v is a value ("Value"):
//
//	value    = 0*255(chr) nblk-chr
//	nblk-chr = %x21-2B / %x2D-3C / %x3E-7E
//	chr      = %x20 / nblk-chr
func tracestateValue(v string) bool {
	if len(v) == 0 || len(v) > 256 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x20 || c > 0x7e || c == ',' || c == '=' || c == ' ' && i == len(v)-1 {
			return false
		}
	}
	return true
}

// appendTraceparent appends the version-00 traceparent of the ids and
// flags ("version-format"; the flags as the propagator writes them:
// sampled and random only).
func appendTraceparent(b []byte, tid trace.TraceID, sid trace.SpanID, flags trace.TraceFlags) []byte {
	const digits = "0123456789abcdef"
	b = append(b, '0', '0', '-')
	for _, c := range tid {
		b = append(b, digits[c>>4], digits[c&15])
	}
	b = append(b, '-')
	for _, c := range sid {
		b = append(b, digits[c>>4], digits[c&15])
	}
	f := byte(flags & (trace.FlagsSampled | trace.FlagsRandom))
	return append(b, '-', digits[f>>4], digits[f&15])
}
