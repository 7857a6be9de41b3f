// Streams through a running Sluice with the official SDKs (versions pinned in
// package.json) and checks what a client sees:
//   - Responses API via openai: output_text deltas, usage in response.completed
//     (or response.incomplete when max_output_tokens cut it);
//   - Messages API via @anthropic-ai/sdk (x-api-key): text deltas, usage in
//     message_start/message_delta;
//   - a 429 surfaces as each SDK's RateLimitError.
// Usage: SLUICE_URL=http://127.0.0.1:8080 SLUICE_KEY=sk-sluice-demo node check.mjs
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const base = process.env.SLUICE_URL ?? "http://127.0.0.1:8080";
const key = process.env.SLUICE_KEY ?? "sk-sluice-demo";
const model = process.env.SLUICE_MODEL ?? "sim-small";
let failed = false;
const check = (ok, what) => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failed = true;
};

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });

// Responses API, streamed.
{
  const stream = await openai.responses.create({ model, input: "hello", max_output_tokens: 8, stream: true });
  let deltas = 0, usage = null, last = "";
  for await (const ev of stream) {
    if (ev.type === "response.output_text.delta") deltas++;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") usage = ev.response.usage;
    last = ev.type;
  }
  check(deltas === 8, `responses: ${deltas} output_text deltas (want 8)`);
  check(usage?.output_tokens === 8 && usage?.input_tokens > 0, `responses: usage ${JSON.stringify(usage)}`);
  check(last.startsWith("response."), `responses: last event ${last}`);
}

// Messages API, streamed.
{
  const stream = await anthropic.messages.create({
    model, max_tokens: 8, stream: true, messages: [{ role: "user", content: "hello" }],
  });
  let deltas = 0, input = 0, output = 0, last = "";
  for await (const ev of stream) {
    if (ev.type === "message_start") input = ev.message.usage.input_tokens;
    if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") deltas++;
    if (ev.type === "message_delta") output = ev.usage.output_tokens;
    last = ev.type;
  }
  check(deltas === 8, `messages: ${deltas} text deltas (want 8)`);
  check(input > 0 && output === 8, `messages: usage input ${input} output ${output}`);
  check(last === "message_stop", `messages: last event ${last}`);
}

// Spend the tenant's requests until refused; each SDK must raise its
// RateLimitError (bounded: at most 400 requests).
async function untilRefused(call, RateLimitError, name) {
  for (let i = 0; i < 400; i += 20) {
    const results = await Promise.allSettled(Array.from({ length: 20 }, call));
    const refused = results.find((r) => r.status === "rejected");
    if (refused) {
      const e = refused.reason;
      check(e instanceof RateLimitError, `${name}: refusal is ${e?.constructor?.name} (status ${e?.status}): ${e?.message}`);
      return e;
    }
  }
  check(false, `${name}: never refused`);
}
const oe = await untilRefused(
  () => openai.responses.create({ model, input: "x", max_output_tokens: 1 }), OpenAI.RateLimitError, "openai");
const ae = await untilRefused(
  () => anthropic.messages.create({ model, max_tokens: 1, messages: [{ role: "user", content: "x" }] }),
  Anthropic.RateLimitError, "anthropic");
check(ae?.error?.type === "error" && ae?.error?.error?.type === "rate_limit_error",
  `anthropic: error body ${JSON.stringify(ae?.error)}`);
check(/^\d+$/.test(ae?.headers?.get?.("anthropic-ratelimit-requests-remaining") ?? ""),
  `anthropic: anthropic-ratelimit-requests-remaining ${ae?.headers?.get?.("anthropic-ratelimit-requests-remaining")}`);
process.exit(failed ? 1 : 0);
