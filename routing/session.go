package routing

// Session affinity pins a session to a backend by rendezvous (highest
// random weight) hashing: every backend of the pool gets the weight
// hash(session, backend label) and the session goes to the candidate of
// highest weight. Adding a backend to n moves only the sessions it now
// wins (about 1/(n+1) of them); removing or ejecting one moves only its
// own sessions, and they come back when it does. No state is kept: every
// node of a fleet maps a session to the same backend.

// sessionBackend returns the candidate of highest rendezvous weight for
// session, with its index.
func sessionBackend(cands []*Backend, session string) (*Backend, int) {
	hs := hashString(session)
	best, bestW := -1, uint64(0)
	for i, c := range cands {
		if w := mix(hs ^ c.hrw); best < 0 || w > bestW {
			best, bestW = i, w
		}
	}
	if best < 0 {
		return nil, -1
	}
	return cands[best], best
}

// hashString is a fixed 64-bit hash of s (FNV-1a, then mixed).
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix(h)
}
