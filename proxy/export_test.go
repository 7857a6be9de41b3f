package proxy

// WSPeakQueued is the most bytes one bridged socket of h has had queued
// for its client.
func WSPeakQueued(h *Handler) int64 { return h.ws.peakQueued.Load() }
