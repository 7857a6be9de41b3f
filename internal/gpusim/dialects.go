package gpusim

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// The simulator also serves the OpenAI Responses API (POST /v1/responses)
// and the Anthropic Messages API (POST /v1/messages), as vLLM v0.11 does
// (vllm/entrypoints/openai/serving_responses.py, vllm/entrypoints/anthropic/).
// Streams follow openai-python v1.109 types/responses (response.created,
// response.output_text.delta …, response.completed with usage
// input_tokens/output_tokens; "event:" lines, no [DONE]) and
// anthropic-sdk-typescript v0.65 MessageStreamEvent (message_start with
// usage.input_tokens, content_block_start/delta/stop, message_delta with
// usage.output_tokens, message_stop). Output items are text only.

// api is the API a generation request speaks.
type api uint8

const (
	apiCompletion api = iota
	apiChat
	apiResponses
	apiMessages
)

func (s *Sim) serveResponses(w http.ResponseWriter, r *http.Request) {
	s.serveGenerate(w, r, apiResponses)
}
func (s *Sim) serveMessages(w http.ResponseWriter, r *http.Request) {
	s.serveGenerate(w, r, apiMessages)
}

// nativePrompt reads a Responses request's input (a string or an array of
// items; instructions count too) as its prompt.
func nativePrompt(req *genRequest) (string, int, *apiError) {
	if len(req.Input) == 0 {
		return "", 0, badRequest("invalid_value", "input is required")
	}
	var s string
	if json.Unmarshal(req.Input, &s) != nil {
		s = string(req.Input)
	}
	s += string(req.Instructions)
	return s, estimateTokens(len(s)), nil
}

// nativeStart appends the events that open a Responses or Messages stream.
func (rd *renderer) nativeStart() {
	switch rd.api {
	case apiResponses:
		rd.responsesEvent("response.created", `"response":`, rd.responseObject("in_progress", nil))
		rd.responsesEvent("response.output_item.added", `"output_index":0,"item":{"id":"msg_`+rd.id+
			`","type":"message","status":"in_progress","role":"assistant","content":[]}`, nil)
		rd.responsesEvent("response.content_part.added", `"item_id":"msg_`+rd.id+
			`","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}`, nil)
	case apiMessages:
		rd.messagesEvent("message_start", `"message":{"id":"msg_`+rd.id+`","type":"message","role":"assistant","model":`+
			string(mustJSON(rd.model))+`,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":`+
			strconv.Itoa(rd.prompt)+`,"output_tokens":1}}`)
		rd.messagesEvent("content_block_start", `"index":0,"content_block":{"type":"text","text":""}`)
	}
}

// nativeToken appends token i's delta event.
func (rd *renderer) nativeToken(i int) {
	tok := tokenJSON(rd.seed, i, true)
	if i < rd.reasoning {
		if rd.api == apiResponses {
			rd.responsesEvent("response.reasoning_text.delta", `"item_id":"rs_`+rd.id+
				`","output_index":0,"content_index":0,"delta":`, tok)
			return
		}
		rd.buf = append(rd.buf, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":"...)
		rd.buf = append(rd.buf, tok...)
		rd.buf = append(rd.buf, "}}\n\n"...)
		return
	}
	if rd.api == apiResponses {
		rd.responsesEvent("response.output_text.delta", `"item_id":"msg_`+rd.id+
			`","output_index":0,"content_index":0,"logprobs":[],"delta":`, tok)
		return
	}
	rd.buf = append(rd.buf, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"...)
	rd.buf = append(rd.buf, tok...)
	rd.buf = append(rd.buf, "}}\n\n"...)
}

// nativeFinish appends the events that close the stream, with usage.
func (rd *renderer) nativeFinish(finish string, prompt, completion int) {
	if rd.api == apiResponses {
		status := "completed"
		if finish == "length" {
			status = "incomplete"
		}
		rd.responsesEvent("response."+status, `"response":`, rd.responseObject(status, []int{prompt, completion}))
		return
	}
	reason := "end_turn"
	if finish == "length" {
		reason = "max_tokens"
	}
	rd.messagesEvent("content_block_stop", `"index":0`)
	rd.messagesEvent("message_delta", `"delta":{"stop_reason":"`+reason+`","stop_sequence":null},"usage":{"output_tokens":`+
		strconv.Itoa(completion)+`}`)
	rd.messagesEvent("message_stop", "")
}

// responseObject is the Responses API response object; usage is
// {prompt, completion} or nil.
func (rd *renderer) responseObject(status string, usage []int) []byte {
	b := []byte(`{"id":"resp_` + rd.id + `","object":"response","created_at":` + strconv.FormatInt(rd.created, 10) +
		`,"model":` + string(mustJSON(rd.model)) + `,"status":"` + status + `","output":[],"usage":`)
	if usage == nil {
		return append(b, "null}"...)
	}
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(usage[0]), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(usage[1]), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(usage[0]+usage[1]), 10)
	return append(b, "}}"...)
}

// responsesEvent appends "event: name" and its data: type, sequence
// number, then fields and value.
func (rd *renderer) responsesEvent(name, fields string, value []byte) {
	rd.buf = append(rd.buf, "event: "...)
	rd.buf = append(rd.buf, name...)
	rd.buf = append(rd.buf, "\ndata: {\"type\":\""...)
	rd.buf = append(rd.buf, name...)
	rd.buf = append(rd.buf, `","sequence_number":`...)
	rd.buf = strconv.AppendInt(rd.buf, int64(rd.seq), 10)
	rd.seq++
	rd.buf = append(rd.buf, ',')
	rd.buf = append(rd.buf, fields...)
	rd.buf = append(rd.buf, value...)
	rd.buf = append(rd.buf, "}\n\n"...)
}

// messagesEvent appends "event: name" and data {"type":name, fields}.
func (rd *renderer) messagesEvent(name, fields string) {
	rd.buf = append(rd.buf, "event: "...)
	rd.buf = append(rd.buf, name...)
	rd.buf = append(rd.buf, "\ndata: {\"type\":\""...)
	rd.buf = append(rd.buf, name...)
	rd.buf = append(rd.buf, '"')
	if fields != "" {
		rd.buf = append(rd.buf, ',')
		rd.buf = append(rd.buf, fields...)
	}
	rd.buf = append(rd.buf, "}\n\n"...)
}

// nativeBody is the non-streamed Responses or Messages answer.
func nativeBody(model string, j *job, text string) []byte {
	if j.api == apiResponses {
		status := "completed"
		if j.finish == "length" {
			status = "incomplete"
		}
		b, _ := json.Marshal(map[string]any{"id": "resp_" + j.id, "object": "response", "created_at": j.created,
			"model": model, "status": status,
			"output": []any{map[string]any{"id": "msg_" + j.id, "type": "message", "status": "completed", "role": "assistant",
				"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}},
			"usage": map[string]int{"input_tokens": j.prompt, "output_tokens": j.limit, "total_tokens": j.prompt + j.limit}})
		return b
	}
	reason := "end_turn"
	if j.finish == "length" {
		reason = "max_tokens"
	}
	b, _ := json.Marshal(map[string]any{"id": "msg_" + j.id, "type": "message", "role": "assistant", "model": model,
		"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": reason, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": j.prompt, "output_tokens": j.limit}})
	return b
}
