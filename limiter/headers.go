package limiter

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
	"unsafe"
)

// policy is one limit as it appears in the response headers.
type policy struct {
	name   string // IETF policy identifier
	quoted string // name as strconv.Quote writes it (a Structured Field string)
	unit   string // IETF "qu" quota unit; empty means the default (requests)
	window bool   // per-minute limit (w=60); concurrency has no window
	q      Quota
}

func (d Decision) policies() (out [5]policy, n int) {
	all := [...]policy{
		{name: ReasonRequests, quoted: `"` + ReasonRequests + `"`, window: true, q: d.Requests},
		{name: ReasonTokens, quoted: `"` + ReasonTokens + `"`, unit: "tokens", window: true, q: d.Tokens},
		{name: ReasonInputTokens, quoted: `"` + ReasonInputTokens + `"`, unit: "tokens", window: true, q: d.InputTokens},
		{name: ReasonOutputTokens, quoted: `"` + ReasonOutputTokens + `"`, unit: "tokens", window: true, q: d.OutputTokens},
		{name: ReasonConcurrency, quoted: `"` + ReasonConcurrency + `"`, unit: "concurrency", q: d.Concurrency},
	}
	for _, p := range all {
		if p.q.Limit > 0 {
			out[n] = p
			n++
		}
	}
	return out, n
}

// The fields SetHeaders writes, in canonical form (as Header.Set would
// write them), so that no key is canonicalized per request.
var (
	hdrPolicy         = http.CanonicalHeaderKey("RateLimit-Policy")
	hdrRateLimit      = http.CanonicalHeaderKey("RateLimit")
	hdrOpenAIRequests = openAIKeys("requests")
	hdrOpenAITokens   = openAIKeys("tokens")
)

func openAIKeys(kind string) [3]string {
	return [3]string{http.CanonicalHeaderKey("x-ratelimit-limit-" + kind),
		http.CanonicalHeaderKey("x-ratelimit-remaining-" + kind), http.CanonicalHeaderKey("x-ratelimit-reset-" + kind)}
}

// SetHeaders writes the rate-limit response fields for d:
//
//   - RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers,
//     Structured Field Lists with one item per configured limit, e.g.
//     `"requests";q=120;w=60, "tokens";q=20000;w=60;qu="tokens",
//     "concurrency";q=8;qu="concurrency"` and `"requests";r=119;t=1, …`,
//     t being whole seconds until the quota is full again). Token limits
//     carry qu="tokens", a unit the draft's registry does not (yet) name;
//   - OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}, the
//     reset as a Go duration ("6m0s", "1.5s", "20ms");
//   - on a refusal (including the closed store policy), Retry-After in
//     whole seconds rounded up and retry-after-ms.
//
// Limits that are not configured are left out; with none, nothing is set
// but Retry-After on refusals.
func SetHeaders(h http.Header, d Decision) {
	// Every value is a substring of one string, and every field's value
	// slice a piece of one array, both in one allocation (headerValues)
	// instead of one or more per field.
	ps, np := d.policies()
	var hv *headerValues
	var b []byte
	if np > 0 || d.Requests.Limit > 0 || d.Tokens.Limit > 0 {
		hv = new(headerValues) // nothing when no field is set
		b = hv.buf[:0]
	}
	var ends [8]int
	n := 0
	mark := func() { ends[n] = len(b); n++ }
	var keys [8]string
	if np > 0 {
		b = appendPolicyField(b, ps[:np])
		keys[n] = hdrPolicy
		mark()
		b = appendRateLimitField(b, ps[:np])
		keys[n] = hdrRateLimit
		mark()
	}
	for _, kind := range [...]struct {
		keys *[3]string
		q    Quota
	}{{&hdrOpenAIRequests, d.Requests}, {&hdrOpenAITokens, d.Tokens}} {
		if kind.q.Limit <= 0 {
			continue
		}
		b = strconv.AppendInt(b, kind.q.Limit, 10)
		keys[n] = kind.keys[0]
		mark()
		b = strconv.AppendInt(b, max(kind.q.Remaining, 0), 10)
		keys[n] = kind.keys[1]
		mark()
		b = appendReset(b, kind.q.Reset)
		keys[n] = kind.keys[2]
		mark()
	}
	if n > 0 {
		// b is never written again (nor is hv.buf if b outgrew it):
		// the string may share its bytes.
		all := unsafe.String(unsafe.SliceData(b), len(b))
		vals := hv.vals[:n]
		start := 0
		for i := range n {
			vals[i] = all[start:ends[i]]
			start = ends[i]
			h[keys[i]] = vals[i : i+1 : i+1]
		}
	}
	if !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(retrySeconds(d.RetryAfter), 10))
		h.Set("retry-after-ms", strconv.FormatInt(max(ceilMS(d.RetryAfter), 1), 10))
	}
}

// headerValues holds SetHeaders' values: the bytes of every value, then
// never modified, and the fields' value slices.
type headerValues struct {
	vals [8]string
	buf  [320]byte
}

func appendPolicyField(b []byte, ps []policy) []byte {
	for i, p := range ps {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, p.quoted...) // the names need no escaping: strconv.Quote's text
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, p.q.Limit, 10)
		if p.window {
			b = append(b, ";w=60"...)
		}
		if p.unit != "" {
			b = append(b, `;qu="`...)
			b = append(b, p.unit...)
			b = append(b, '"')
		}
	}
	return b
}

func appendRateLimitField(b []byte, ps []policy) []byte {
	for i, p := range ps {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, p.quoted...) // the names need no escaping: strconv.Quote's text
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, max(p.q.Remaining, 0), 10)
		if p.window {
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, ceilSeconds(p.q.Reset), 10)
		}
	}
	return b
}

// appendReset appends resetString(d) without allocating: d rounded up to
// whole milliseconds, formatted as time.Duration.String formats it ("0s",
// "20ms", "1.5s", "6m0s", "1h0m0s").
func appendReset(b []byte, d time.Duration) []byte {
	ms := ceilMS(d)
	switch {
	case ms <= 0:
		return append(b, "0s"...)
	case ms < 1000:
		return append(strconv.AppendInt(b, ms, 10), "ms"...)
	}
	if h := ms / 3600000; h > 0 {
		b = append(strconv.AppendInt(b, h, 10), 'h')
		ms %= 3600000
		b = append(strconv.AppendInt(b, ms/60000, 10), 'm')
	} else if m := ms / 60000; m > 0 {
		b = append(strconv.AppendInt(b, m, 10), 'm')
	}
	ms %= 60000
	b = strconv.AppendInt(b, ms/1000, 10)
	if frac := ms % 1000; frac > 0 {
		digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		k := 3
		for digits[k-1] == '0' {
			k--
		}
		b = append(append(b, '.'), digits[:k]...)
	}
	return append(b, 's')
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// retrySeconds is Retry-After: whole seconds rounded up, at least 1.
func retrySeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// errorBody is OpenAI's error shape; the SDKs raise RateLimitError on a
// 429 and read message/type/code from it.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
		// Limit and RetryAfterMS are Sluice's additions: which limit
		// refused and when to retry.
		Limit        string `json:"limit,omitempty"`
		RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	} `json:"error"`
}

// ErrorBody is the JSON body of a refusal in OpenAI's error shape: for a
// limit (answered with 429) type and code "rate_limit_exceeded", for the
// closed store policy (answered with 503) type "server_error" and code
// "rate_limiter_unavailable"; both name the limit and when to retry. It
// returns nil for an allowed decision.
func ErrorBody(d Decision) []byte {
	if d.Allowed {
		return nil
	}
	var e errorBody
	e.Error.Limit = d.Reason
	e.Error.RetryAfterMS = max(ceilMS(d.RetryAfter), 1)
	retry := "Please try again in " + resetString(d.RetryAfter) + "."
	if d.Reason == ReasonStore {
		e.Error.Type, e.Error.Code = "server_error", "rate_limiter_unavailable"
		e.Error.Message = "Rate limiting is temporarily unavailable. " + retry
	} else {
		e.Error.Type, e.Error.Code = "rate_limit_exceeded", "rate_limit_exceeded"
		e.Error.Message = refusalMessage(d) + " " + retry
	}
	b, _ := json.Marshal(e) // cannot fail: strings and integers only
	return b
}

// StatusCode is the HTTP status for a refused decision: 503 for the closed
// store policy, 429 for a limit; 200 when allowed.
func StatusCode(d Decision) int {
	switch {
	case d.Allowed:
		return http.StatusOK
	case d.Reason == ReasonStore:
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

func refusalMessage(d Decision) string {
	what, q := "", Quota{}
	switch d.Reason {
	case ReasonRequests:
		what, q = "requests per minute (RPM)", d.Requests
	case ReasonTokens:
		what, q = "tokens per minute (TPM)", d.Tokens
	case ReasonInputTokens:
		what, q = "input tokens per minute", d.InputTokens
	case ReasonOutputTokens:
		what, q = "output tokens per minute", d.OutputTokens
	case ReasonConcurrency:
		return "Rate limit reached for concurrent requests: limit " +
			strconv.FormatInt(d.Concurrency.Limit, 10) + " in flight."
	default:
		return "Rate limit reached."
	}
	return "Rate limit reached for " + what + ": limit " + strconv.FormatInt(q.Limit, 10) +
		", remaining " + strconv.FormatInt(max(q.Remaining, 0), 10) + "."
}
