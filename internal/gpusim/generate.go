package gpusim

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

func (s *Sim) serveChat(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, apiChat) }
func (s *Sim) serveCompletion(w http.ResponseWriter, r *http.Request) {
	s.serveGenerate(w, r, apiCompletion)
}

// serveGenerate answers a chat or completion request: validate, apply the
// request's faults, queue its sequence in the engine, then stream or
// return the tokens as the scheduler produces them.
func (s *Sim) serveGenerate(w http.ResponseWriter, r *http.Request, a api) {
	s.total.Add(1)
	j, e := s.parseGenerate(w, r, a)
	var f faults
	if e == nil {
		f, e = s.faultsFor(r)
	}
	if e != nil {
		s.writeError(w, e)
		return
	}
	ctx := r.Context()
	if !sleep(ctx, s.closing, f.slowStart, false) {
		s.gone(w, ctx)
		return
	}
	if f.failFirst {
		s.failed.Add(1)
		s.writeError(w, errInjected())
		return
	}
	var src source
	if s.cfg.Pace > 0 {
		p := s.newPacer(j)
		defer p.end()
		src = p
	} else {
		q := newSeq(j.prompt, j.limit, j.finish)
		q.blocks = j.blocks
		if !s.submit(ctx, q) {
			s.gone(w, ctx)
			return
		}
		defer s.release(q)
		src = seqSource{s, q}
	}
	j.id = s.newID(j.chat)
	j.created = time.Now().Unix()
	if j.stream {
		s.stream(w, r, j, src, f)
	} else {
		s.respond(w, r, j, src, f)
	}
}

// source is where a request's tokens come from: the batch scheduler (a
// seq) or, with Config.Pace, the request's own pacer.
type source interface {
	// progress returns how many tokens have been produced and whether
	// that is all of them.
	progress() (produced int, done bool)
	// wait blocks until more tokens may have been produced (true) or the
	// client goes away (false, counted as a cancel); it aborts the
	// response when the Sim closes.
	wait(ctx context.Context) bool
}

// seqSource reads a sequence run by the batch scheduler.
type seqSource struct {
	s *Sim
	q *seq
}

func (x seqSource) progress() (int, bool) {
	done := x.q.finished.Load() // before produced: then produced is final
	return int(x.q.produced.Load()), done
}

// cachedOf is the prompt tokens src found in the prefix cache, known
// once its first token is produced.
func cachedOf(j *job, src source) int {
	if j.blocks == nil && j.cached < 0 {
		return -1 // no prefix cache
	}
	if x, ok := src.(seqSource); ok {
		return int(x.q.cached.Load())
	}
	return j.cached // the pacer set it
}

func (x seqSource) wait(ctx context.Context) bool { return x.s.wait(ctx, x.q) }

// submit hands q to the scheduler; false if the client or the Sim went
// away first.
func (s *Sim) submit(ctx context.Context, q *seq) bool {
	q.arrived = time.Now()
	select {
	case <-s.closing: // the events buffer would still take q
		return false
	default:
	}
	select {
	case s.events <- seqEvent{q: q}:
		return true
	case <-ctx.Done():
	case <-s.closing:
	}
	return false
}

// release takes q out of the engine unless it finished there: this is how a
// client that goes away frees its batch slot at once.
func (s *Sim) release(q *seq) {
	if q.finished.Load() {
		return
	}
	select {
	case s.events <- seqEvent{q: q, cancel: true}:
	case <-s.exited:
	}
}

// gone ends a request whose client or Sim went away before its headers.
func (s *Sim) gone(w http.ResponseWriter, ctx context.Context) {
	if ctx.Err() != nil {
		s.cancelled.Add(1)
		return
	}
	s.writeError(w, errClosed())
}

// abort ends a response that has started: the connection is closed (on
// HTTP/1.1 without the last chunk, on HTTP/2 with a stream reset), so the
// client sees a truncated body. net/http recovers this panic silently.
func abort() {
	panic(http.ErrAbortHandler)
}

// stream answers with server-sent events, one chunk per token, each
// flushed as soon as it is produced. A reader that falls behind gets every
// event produced meanwhile in one write.
func (s *Sim) stream(w http.ResponseWriter, r *http.Request, j *job, src source, f faults) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	st := &sseStream{s: s, w: w, rc: http.NewResponseController(w), rd: newRenderer(s.cfg.Model, j, s.cfg.StampTokens),
		ctx: r.Context(), f: f, roleDue: j.chat || j.api >= apiResponses}
	if !st.flush() {
		return
	}
	for {
		produced, done := src.progress()
		if !st.send(min(produced, j.limit), done) {
			return
		}
		if done {
			break
		}
		if !src.wait(st.ctx) {
			return
		}
	}
	if j.api >= apiResponses {
		st.rd.nativeFinish(j.finish, j.prompt, j.limit)
	} else {
		finish := j.finish
		if j.tool != "" {
			finish = "tool_calls"
		}
		st.rd.finish(finish)
		if j.includeUsage {
			st.rd.usageChunk(j.prompt, j.limit, cachedOf(j, src))
		}
		st.rd.buf = append(st.rd.buf, doneEvent...)
	}
	if st.flush() {
		s.completed.Add(1)
	}
}

// sseStream is one stream's writing state.
type sseStream struct {
	s       *Sim
	w       http.ResponseWriter
	rc      *http.ResponseController
	rd      *renderer
	ctx     context.Context
	f       faults
	sent    int  // tokens rendered
	stalled bool // the stall has happened
	roleDue bool // the chat role chunk is still to send
}

// send renders and flushes the tokens up to avail, applying die-after and
// stall-after; false when the stream must end here.
func (st *sseStream) send(avail int, done bool) bool {
	if st.roleDue && (avail > 0 || done) {
		st.rd.role() // with the first token, as vLLM sends it
		st.roleDue = false
	}
	for st.sent < avail {
		st.rd.token(st.sent)
		st.sent++
		if len(st.rd.buf) >= maxPending && !st.s.write(st.w, st.rd) {
			return false
		}
		if st.sent == st.f.dieAfter {
			st.flush()
			st.s.failed.Add(1)
			abort()
		}
		if st.sent == st.f.stallAfter && !st.stalled {
			st.stalled = true
			if !st.flush() || !st.s.stall(st.ctx, st.f.stallFor) {
				return false
			}
		}
	}
	return st.flush()
}

func (st *sseStream) flush() bool { return st.s.flush(st.w, st.rc, st.rd) }

// maxPending bounds the events a stream buffers before writing them, so a
// reader far behind costs bounded memory.
const maxPending = 32 << 10

// write writes rd's pending events; false (counted as a cancel) when the
// client is gone.
func (s *Sim) write(w http.ResponseWriter, rd *renderer) bool {
	if len(rd.buf) == 0 {
		return true
	}
	if rd.stamp {
		rd.stampAll(time.Now().UnixNano())
	}
	_, err := w.Write(rd.buf)
	rd.buf = rd.buf[:0]
	if err != nil {
		s.cancelled.Add(1)
		return false
	}
	return true
}

// flush writes and flushes rd's pending events; false (counted as a
// cancel) when the client is gone.
func (s *Sim) flush(w http.ResponseWriter, rc *http.ResponseController, rd *renderer) bool {
	if !s.write(w, rd) {
		return false
	}
	if err := rc.Flush(); err != nil {
		s.cancelled.Add(1)
		return false
	}
	return true
}

// wait blocks until q makes progress (true), the client goes away (false,
// counted as a cancel) or the Sim closes (abort).
func (s *Sim) wait(ctx context.Context, q *seq) bool {
	select {
	case <-q.notify:
		return true
	case <-ctx.Done():
		s.cancelled.Add(1)
		return false
	case <-s.closing:
		abort()
	}
	return false
}

// stall holds a response for d (0: until the client goes away). The engine
// keeps generating meanwhile; the backlog is sent when the stall ends.
func (s *Sim) stall(ctx context.Context, d time.Duration) bool {
	if sleep(ctx, s.closing, d, d == 0) {
		return true
	}
	if ctx.Err() == nil {
		abort() // the Sim is closing
	}
	s.cancelled.Add(1)
	return false
}

// respond answers with one JSON body once the sequence has finished.
func (s *Sim) respond(w http.ResponseWriter, r *http.Request, j *job, src source, f faults) {
	ctx := r.Context()
	for {
		produced, done := src.progress()
		if done {
			break
		}
		if f.dieAfter > 0 && j.limit >= f.dieAfter && produced >= f.dieAfter {
			s.failed.Add(1)
			abort()
		}
		if !src.wait(ctx) {
			return
		}
	}
	if f.dieAfter > 0 && j.limit >= f.dieAfter {
		s.failed.Add(1)
		abort()
	}
	if f.stallAfter > 0 && j.limit >= f.stallAfter && !s.stall(ctx, f.stallFor) {
		return
	}
	j.cached = cachedOf(j, src)
	body := responseBody(s.cfg.Model, j)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	s.setLoadHeader(h, r)
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		s.cancelled.Add(1)
		return
	}
	s.completed.Add(1)
}

// writeError answers e (vLLM sends no load header with errors).
func (s *Sim) writeError(w http.ResponseWriter, e *apiError) {
	writeError(w, e)
}

// newID returns a fresh response id, "chatcmpl-…" or "cmpl-…".
func (s *Sim) newID(chat bool) string {
	kind := "cmpl-"
	if chat {
		kind = "chatcmpl-"
	}
	return kind + s.idPrefix + strconv.FormatUint(s.ids.Add(1), 16)
}
