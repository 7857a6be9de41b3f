package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Request bodies are read into a buffer that grows as bytes arrive, never
// to the declared Content-Length before they do: a client that declares
// 1MiB and sends one byte costs firstBodyChunk bytes, not 1MiB. Every byte
// of capacity is reserved from the node's body budget (body_memory_bytes)
// before it is allocated and given back when the request ends, so many
// unfinished bodies get 503 instead of growing the process. A tenant may
// have at most tenant_bodies_in_flight bodies being received at once, and
// each body must arrive within body_read_timeout at body_min_rate or
// better (after a grace period), else 408.

const (
	// firstBodyChunk is the first buffer's size; it doubles from there.
	firstBodyChunk = 4 << 10
	// bodyRateGrace is the time a body may take before body_min_rate
	// applies (a handshake's worth of slow start).
	bodyRateGrace = 5 * time.Second
)

// bodyBudget is the node-wide memory budget for request bodies.
type bodyBudget struct {
	used atomic.Int64
}

// reserve takes n bytes from a budget of limit; false when they do not fit.
func (b *bodyBudget) reserve(n, limit int64) bool {
	if b.used.Add(n) > limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *bodyBudget) release(n int64) {
	if n != 0 {
		b.used.Add(-n)
	}
}

// tenantBodies counts the bodies each tenant is sending now.
type tenantBodies struct {
	m sync.Map // tenant ID -> *atomic.Int64
}

func (t *tenantBodies) counter(id string) *atomic.Int64 {
	if c, ok := t.m.Load(id); ok {
		return c.(*atomic.Int64)
	}
	c, _ := t.m.LoadOrStore(id, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// bodyLimits are the bounds one body is read within.
type bodyLimits struct {
	max     int64         // max_body_bytes
	timeout time.Duration // body_read_timeout
	minRate int64         // body_min_rate, bytes per second
	budget  int64         // body_memory_bytes
}

func (c *Config) bodyLimits() bodyLimits {
	return bodyLimits{max: int64(c.MaxBodyBytes), timeout: c.BodyReadTimeout,
		minRate: int64(c.BodyMinRate), budget: int64(c.BodyMemoryBytes)}
}

var (
	errBodyBudget = &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "body_memory_exhausted",
		Message: "the node is receiving too many request bodies; retry", RetryAfter: 1}
	errBodySlow = &APIError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "body_timeout",
		Message: "the request body arrived too slowly"}
	errTenantBodies = &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_bodies",
		Message: "too many request bodies in flight for this key; retry", RetryAfter: 1}
	errBodyRead = &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error",
		Code: "body_read_error", Message: "could not read the request body"}
)

// readBody reads the request body within lim. reserved is the capacity
// taken from budget, to be released by the caller (also on error) once the
// body is no longer used. w may be nil (no read deadline is set then; the
// timeout closes the body instead). The time limits count from start (the
// caller's last clock read).
func readBody(w http.ResponseWriter, r *http.Request, lim bodyLimits, budget *bodyBudget, start time.Time) (body []byte, reserved int64, err error) {
	if r.ContentLength > lim.max {
		return nil, 0, tooLarge(lim.max)
	}
	hard := start.Add(lim.timeout)
	// A body already whole in the server's buffer (listen's h1Body.Whole)
	// is read without the socket: no deadline or timer is set for it.
	wb, _ := r.Body.(interface{ Whole() bool })
	whole := wb != nil && wb.Whole()
	var rc *http.ResponseController
	if w != nil && !whole {
		rc = http.NewResponseController(w)
		// The first deadline: the end of the grace period when a minimum
		// rate applies after it, else the hard limit (one call, not the
		// hard limit then the grace period's end: each is a timer change
		// in the netpoller).
		first := hard
		if lim.minRate > 0 && bodyRateGrace < lim.timeout {
			first = start.Add(bodyRateGrace)
		}
		if rc.SetReadDeadline(first) != nil {
			rc = nil
		} else {
			// The deadline is cleared only after a body read whole: after
			// a failure it stays, so the server's discard of the unread
			// rest cannot be held open by a trickle either.
			defer func() {
				if err == nil {
					rc.SetReadDeadline(time.Time{})
				}
			}()
		}
	}
	var slow *atomic.Bool // set only here: allocated only without deadlines
	if rc == nil && !whole {
		// No read deadline on this transport: close the body at the hard
		// limit, which ends a blocked read.
		slow = new(atomic.Bool)
		t := time.AfterFunc(lim.timeout, func() { slow.Store(true); r.Body.Close() })
		defer t.Stop()
	}
	// Capacity: the declared length when known (never more than the
	// first chunk before bytes arrive), else doubling from the first chunk.
	want := int64(firstBodyChunk)
	if r.ContentLength >= 0 && r.ContentLength < want {
		want = r.ContentLength + 1 // +1 sees EOF without growing
	}
	var buf []byte
	var n int64
	for {
		if n == int64(len(buf)) {
			if n > lim.max {
				return nil, reserved, tooLarge(lim.max)
			}
			size := want
			if len(buf) > 0 {
				size = 2 * int64(len(buf))
			}
			if r.ContentLength > 0 && size > r.ContentLength+1 {
				size = r.ContentLength + 1
			}
			if size > lim.max+1 {
				size = lim.max + 1
			}
			if !budget.reserve(size-int64(len(buf)), lim.budget) {
				return nil, reserved, errBodyBudget
			}
			reserved += size - int64(len(buf))
			nb := make([]byte, size)
			copy(nb, buf[:n])
			buf = nb
		}
		m, rerr := r.Body.Read(buf[n:])
		n += int64(m)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if slow != nil && slow.Load() || errors.Is(rerr, os.ErrDeadlineExceeded) || !time.Now().Before(hard) {
				return nil, reserved, errBodySlow
			}
			return nil, reserved, errBodyRead
		}
		if n > lim.max {
			return nil, reserved, tooLarge(lim.max)
		}
		if rc != nil && lim.minRate > 0 && m > 0 {
			// Each byte buys 1/minRate of time beyond the grace period.
			d := start.Add(bodyRateGrace + time.Duration(n*int64(time.Second)/lim.minRate))
			if d.After(hard) {
				d = hard
			}
			rc.SetReadDeadline(d)
		}
	}
	return buf[:n:n], reserved, nil
}

func tooLarge(limit int64) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Code: "request_too_large", Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
}

// BodyMemory is the request-body memory the node holds now (reserved from
// body_memory_bytes).
func (h *Handler) BodyMemory() int64 { return h.bodies.used.Load() }
