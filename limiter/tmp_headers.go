package limiter

import "net/http"

// SetHeaders is a placeholder until the limiter package lands.
func SetHeaders(h http.Header, d Decision) {}

// ErrorBody is a placeholder until the limiter package lands.
func ErrorBody(d Decision) []byte {
	return []byte(`{"error":{"message":"rate limited","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}`)
}
