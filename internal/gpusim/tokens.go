package gpusim

import (
	"encoding/json"
	"hash/fnv"
	"strings"
)

// words is the simulated vocabulary. A token is one word; some carry
// punctuation so that the text reads like prose.
var words = strings.Fields(`the a of and to in is that it for on with as was
by at from this be are or an which not but have has had its were all one
their more when there can also into other time some what only new about
these may first then than after two over would most such made like where
through many between being those under both each while because however
system model token batch latency stream request network queue memory cache
engine signal result value answer question reason method number order
simple careful quick steady large small early late clear bright quiet
runs moves grows waits sends builds finds keeps gives shows makes takes
well now often again here today still always never together
time. day. work. way. point. place. world. answer. result. stream.
however, then, and, but, so, yet,`)

// vocab holds every word pre-rendered as a JSON string, in two forms: with
// a leading space (" word", the usual token) and capitalised without it
// ("Word", the first token of a chat reply).
var vocab = func() (v struct{ spaced, first [][]byte }) {
	for _, w := range words {
		v.spaced = append(v.spaced, mustJSON(" "+w))
		v.first = append(v.first, mustJSON(strings.ToUpper(w[:1])+w[1:]))
	}
	return v
}()

func mustJSON(s string) []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // unreachable: a string always marshals
	}
	return b
}

// textSeed derives a request's token stream seed from the Sim seed and the
// request's prompt text, so equal prompts give equal outputs.
func textSeed(seed int64, kind, text string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(seed) >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(text))
	return h.Sum64()
}

// splitmix64 is a fast, well-mixing 64-bit hash.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// tokenWord returns the vocabulary index of token i of a stream.
func tokenWord(seed uint64, i int) int {
	return int(splitmix64(seed+uint64(i)*0x9e3779b97f4a7c15) % uint64(len(words)))
}

// tokenJSON returns token i pre-rendered as a JSON string. In a chat reply
// (chat true) the first token is capitalised and has no leading space.
func tokenJSON(seed uint64, i int, chat bool) []byte {
	w := tokenWord(seed, i)
	if chat && i == 0 {
		return vocab.first[w]
	}
	return vocab.spaced[w]
}

// tokenText returns token i as plain text.
func tokenText(seed uint64, i int, chat bool) string {
	w := words[tokenWord(seed, i)]
	if chat && i == 0 {
		return strings.ToUpper(w[:1]) + w[1:]
	}
	return " " + w
}

// stopIndex returns the index of the first of the first n tokens whose
// word (without its leading space) equals one of stops, or -1.
func stopIndex(seed uint64, n int, stops []string) int {
	if len(stops) == 0 {
		return -1
	}
	for i := range n {
		w := words[tokenWord(seed, i)]
		for _, s := range stops {
			if strings.EqualFold(strings.TrimSpace(s), w) {
				return i
			}
		}
	}
	return -1
}

// estimateTokens is the simulated tokenizer: about four characters a token,
// at least one.
func estimateTokens(chars int) int {
	return max(1, (chars+3)/4)
}
