package gpusim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// apiError is an error answered in OpenAI's shape:
// {"error":{"message":…,"type":…,"param":null,"code":…}}.
type apiError struct {
	status  int
	message string
	typ     string // OpenAI error type, e.g. "invalid_request_error"
	code    string
}

func (e *apiError) Error() string { return e.message }

func badRequest(code, format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...), "invalid_request_error", code}
}

func errInvalidJSON(err error) *apiError {
	return badRequest("invalid_json", "We could not parse the JSON body of your request: %v", err)
}

func errUnknownModel(model string) *apiError {
	return &apiError{http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model),
		"invalid_request_error", "model_not_found"}
}

func errNotFound(path string) *apiError {
	return &apiError{http.StatusNotFound, fmt.Sprintf("Unknown path %q.", path),
		"invalid_request_error", "not_found"}
}

func errMethod(method string) *apiError {
	return &apiError{http.StatusMethodNotAllowed, fmt.Sprintf("Method %s is not allowed here.", method),
		"invalid_request_error", "method_not_allowed"}
}

func errInjected() *apiError {
	return &apiError{http.StatusInternalServerError,
		"The simulated server failed before the first token (fault injection).",
		"server_error", "internal_error"}
}

func errClosed() *apiError {
	return &apiError{http.StatusServiceUnavailable, "The simulated server is shutting down.",
		"server_error", "unavailable"}
}

func errTooLarge(limit int64) *apiError {
	return &apiError{http.StatusRequestEntityTooLarge,
		fmt.Sprintf("The request body is larger than %d bytes.", limit),
		"invalid_request_error", "request_too_large"}
}

// writeError writes e as an OpenAI error body.
func writeError(w http.ResponseWriter, e *apiError) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.message, "type": e.typ, "param": nil, "code": e.code,
	}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	_, _ = w.Write(body)
}
