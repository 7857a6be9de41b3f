package proxy

import (
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
)

// modelsBody is the answer to GET /v1/models from the route table.
func modelsBody(models []string) []byte {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, m := range models {
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "sluice"})
	}
	b, _ := json.Marshal(list)
	return append(b, '\n')
}

// newID returns a random 128-bit request id in hex.
func newID() string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	var h [32]byte // encoded on the stack: one allocation, the string
	hex.Encode(h[:], b[:])
	return string(h[:])
}
