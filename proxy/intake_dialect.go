package proxy

import "strconv"

// parseRequest reads the request's fields in its dialect: chat and
// completions with parseOpenAI; Responses (max_output_tokens, input,
// instructions) and Messages (max_tokens, messages, system) with
// parseNative, which leaves the body as the client sent it (these APIs
// report usage in their streams: no stream_options to add). A request
// without an output bound leaves OutputTokens zero: the limiter reserves
// the tenant's default_max_tokens for it.
func (x *exchange) parseRequest(body []byte) (requestMeta, []byte, error) {
	var (
		m   requestMeta
		out []byte
		err error
	)
	switch x.dialect {
	case dialectResponses, dialectMessages:
		m, err = parseNative(body, x.dialect)
		out = body
	default:
		m, out, err = parseOpenAI(body)
	}
	return m, out, err
}

var (
	responsesNames = []string{"model", "stream", "max_output_tokens", "n", "best_of", "input", "instructions"}
	messagesNames  = []string{"model", "stream", "max_tokens", "n", "best_of", "messages", "system"}
)

// parseNative reads a Responses or Messages request: model, stream, the
// output bound, n and best_of (neither API defines them, but a backend
// that takes them generates that many sequences: reserved as parseOpenAI
// does), and the size of the prompt members (4 bytes a token, as
// parseOpenAI estimates).
func parseNative(body []byte, d dialect) (requestMeta, error) {
	names := responsesNames
	if d == dialectMessages {
		names = messagesNames
	}
	var (
		m      requestMeta
		model  []byte
		prompt int
		has    bool
		f      openAIFields // for intValue's type error
		seen   [5]bool
		bad    error
	)
	i := skipSpace(body, 0)
	end := -1
	if i < len(body) && body[i] == '{' {
		end = scanObject(body, i, 1, func(key []byte, v int) int {
			exact, fold := fieldIndex(key, names)
			if fold >= 0 && fold < len(seen) {
				// model, stream, the output bound, n and best_of are acted
				// on here: one exact spelling, once (as parseOpenAI's
				// openAIUnique).
				if exact < 0 || seen[fold] {
					bad = badRequest("duplicate_field", "the field "+strconv.Quote(names[fold])+
						" is repeated or spelled in another case; send it once, spelled exactly")
					return -1
				}
				seen[fold] = true
			}
			switch exact {
			case 0:
				if body[v] != '"' {
					return -1
				}
				end := stringValid(body, v)
				if end > 0 {
					model = body[v:end]
					m.modelAt, m.modelEnd = v, end
				}
				return end
			case 1:
				return boolValue(body, v, &m.Stream)
			case 2:
				return f.intValue(body, v, names[2], &m.OutputTokens, &has)
			case 3:
				return f.choices(body, v, "n", &f.n, &f.hasN)
			case 4:
				return f.choices(body, v, "best_of", &f.bestOf, &f.hasBestOf)
			case 5, 6:
				end := skipValue(body, v, 1)
				prompt += end - v
				if exact == 5 && end > 0 { // input or messages: the prompt for prefix affinity
					m.promptAt, m.promptEnd = v, end
				}
				return end
			}
			return skipValue(body, v, 1)
		})
	}
	if bad != nil {
		return requestMeta{}, bad
	}
	if f.err != nil {
		return requestMeta{}, f.err
	}
	if end < 0 || skipSpace(body, end) != len(body) {
		return requestMeta{}, badRequest("invalid_json", "request body is not a valid JSON object")
	}
	if model != nil {
		m.Model = unquote(model)
	}
	m.OutputTokens = max(m.OutputTokens, 0)
	m.InputTokens = int64(prompt+3) / 4
	m.N = 1
	if f.hasN {
		m.N = f.n
	}
	if f.hasBestOf {
		m.N = max(m.N, f.bestOf)
	}
	m.ClientUsage = true // the stream's usage events are the client's own
	return m, nil
}
