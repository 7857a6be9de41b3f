// check-h3.mjs: streams chat completions from Sluice over HTTP/3 in a real
// Chromium and counts how many bodies end cleanly.
//
// Issue 17: Chromium failed a streaming fetch() over HTTP/3 with "network
// error" at the end of the body when a trailer came after the last event in a
// later packet. This script runs the browser's own code path (fetch, a
// ReadableStream reader read to the end, PerformanceResourceTiming) against a
// running server, in several cases, and exits 1 when any request did not end
// cleanly, was not served over h3, or (for Sluice) lost its Server-Timing.
//
// Usage (see README.md): node check-h3.mjs [-origin https://127.0.0.1:18443]
//   [-n 30] [-parallel 1] [-cases plain,te-js,comment,te-cdp]
//   [-chromium /usr/bin/chromium] [-netlog FILE] [-key sk-sluice-demo]
//   [-expect sluice|any] [-max-tokens 16] [-timeout 20000 (ms)]
// Flags take one dash or two.
//
// The server must serve TLS over TCP on the same port as QUIC with the same
// certificate: the script reads the certificate there to pin its SPKI hash
// (--ignore-certificate-errors-spki-list, which Chromium requires for QUIC
// with a self-signed certificate), then forces QUIC to the origin.

import { chromium } from 'playwright-core';
import { createHash } from 'node:crypto';
import { mkdtempSync, mkdirSync, rmSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import tls from 'node:tls';

const opts = parseArgs(process.argv.slice(2), {
  origin: 'https://127.0.0.1:18443',
  n: '30',
  parallel: '1',
  cases: 'plain,te-js,comment,te-cdp',
  chromium: '/usr/bin/chromium',
  netlog: '',
  key: 'sk-sluice-demo',
  'max-tokens': '16',
  expect: 'sluice',
  timeout: '20000',
});

function parseArgs(argv, defaults) {
  const out = { ...defaults };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i].replace(/^--?/, '');
    if (!(a in defaults)) throw new Error(`unknown flag ${argv[i]}`);
    out[a] = argv[++i];
  }
  return out;
}

// spkiHash returns base64(sha256(SubjectPublicKeyInfo)) of the certificate
// the server presents on TCP: the form --ignore-certificate-errors-spki-list
// takes.
function spkiHash(host, port) {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host, port, servername: host === '127.0.0.1' ? undefined : host, rejectUnauthorized: false, ALPNProtocols: ['http/1.1'] }, () => {
      const der = s.getPeerX509Certificate().publicKey.export({ type: 'spki', format: 'der' });
      s.end();
      resolve(createHash('sha256').update(der).digest('base64'));
    });
    s.on('error', reject);
  });
}

// The code that runs in the page: one streaming fetch read to its end.
// It returns what happened, never throws.
async function pageStream({ url, key, maxTokens, extraHeaders, timeoutMs }) {
  const started = performance.now();
  const r = { url, ok: false, error: null, status: 0, bytes: 0, reads: 0, done: false, comment: null, trailerHeader: null, serverTimingHeader: null };
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(new Error('timeout')), timeoutMs);
  let text = '';
  try {
    const res = await fetch(url, {
      method: 'POST',
      signal: ctl.signal,
      headers: { 'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json', ...extraHeaders },
      body: JSON.stringify({ model: 'sim-small', stream: true, max_tokens: maxTokens, messages: [{ role: 'user', content: 'hello from chromium' }] }),
    });
    r.status = res.status;
    r.trailerHeader = res.headers.get('trailer');
    r.serverTimingHeader = res.headers.get('server-timing');
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      r.reads++;
      r.bytes += value.length;
      text += dec.decode(value, { stream: true });
    }
    r.done = /(^|\n)data: \[DONE\]\n\n$/.test(text);
    const m = text.match(/^: server-timing (.*)$/m);
    r.comment = m ? m[1] : null;
    r.ok = r.status === 200 && r.done;
    if (!r.ok && !r.error) r.error = `status ${r.status}, ends with ${JSON.stringify(text.slice(-40))}`;
  } catch (e) {
    r.error = `${e && e.name}: ${e && e.message}`;
    // Whether the whole body had arrived when the read failed.
    r.doneBeforeError = /(^|\n)data: \[DONE\]\n\n$/.test(text);
  } finally {
    clearTimeout(timer);
  }
  r.ms = performance.now() - started;
  // The resource timing entry is added when the body has been consumed;
  // wait for it (bounded).
  for (let i = 0; i < 50; i++) {
    const e = performance.getEntriesByName(url, 'resource')[0];
    if (e) {
      r.nextHopProtocol = e.nextHopProtocol;
      r.serverTiming = e.serverTiming.map((s) => s.name);
      break;
    }
    await new Promise((res) => setTimeout(res, 20));
  }
  return r;
}

const CASES = {
  // A browser's request as browsers send it.
  plain: { extraHeaders: {} },
  // fetch() forbids TE: Chromium drops it, so Sluice sends no trailer.
  'te-js': { extraHeaders: { 'TE': 'trailers' } },
  // The browser's way to the final timing: an SSE comment before [DONE].
  comment: { extraHeaders: { 'X-Sluice-Timing': 'comment' } },
  // TE: trailers added below JS through the DevTools protocol
  // (Network.setExtraHTTPHeaders), so Sluice sends its trailer to a real
  // Chromium: the path of issue 17.
  'te-cdp': { extraHeaders: {}, cdpHeaders: { 'TE': 'trailers' } },
};

async function main() {
  const origin = new URL(opts.origin);
  const host = origin.hostname;
  const port = Number(origin.port || 443);
  const spki = await spkiHash(host, port);
  const userDataDir = mkdtempSync(join(tmpdir(), 'sluice-chromium-'));
  const args = [
    '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--enable-quic', `--origin-to-force-quic-on=${host}:${port}`,
    `--ignore-certificate-errors-spki-list=${spki}`,
  ];
  if (opts.netlog) {
    mkdirSync(dirname(resolve(opts.netlog)), { recursive: true }); // Chromium does not make it
    args.push(`--log-net-log=${opts.netlog}`, '--net-log-capture-mode=Everything');
  }
  // Only these flags: Playwright's defaults (dozens of --disable-features
  // and the like) are left out, so the pipe it drives Chromium through and
  // the profile are given here.
  const ctx = await chromium.launchPersistentContext(userDataDir, {
    executablePath: opts.chromium, headless: true, ignoreDefaultArgs: true,
    args: [...args, '--remote-debugging-pipe', `--user-data-dir=${userDataDir}`, 'about:blank'],
  });
  let failed = 0;
  const summary = [];
  try {
    const browserVersion = ctx.browser() ? ctx.browser().version() : '(persistent context)';
    const page = ctx.pages()[0] || await ctx.newPage();
    const ua = await page.evaluate(() => navigator.userAgent).catch(() => '');
    console.log(`chromium: ${opts.chromium} ${browserVersion} ${ua}`);
    console.log(`flags: ${args.join(' ')}`);
    // Any document of the origin will do (a 401 JSON here): the page's
    // fetches are then same-origin, their Server-Timing readable without
    // Timing-Allow-Origin.
    const nav = await page.goto(origin.origin + '/', { waitUntil: 'load' });
    const navProto = await page.evaluate(() => performance.getEntriesByType('navigation')[0]?.nextHopProtocol);
    console.log(`page: ${origin.origin}/ status ${nav && nav.status()} over ${navProto}`);
    await page.evaluate(() => performance.setResourceTimingBufferSize(100000));
    // Chromium's own verdict on each request (net::ERR_...), by URL.
    const cdp = await ctx.newCDPSession(page);
    const urlById = new Map();
    const netError = new Map();
    cdp.on('Network.requestWillBeSent', (e) => urlById.set(e.requestId, e.request.url));
    cdp.on('Network.loadingFailed', (e) => netError.set(urlById.get(e.requestId), e.errorText));
    await cdp.send('Network.enable');
    const n = Number(opts.n);
    const par = Math.max(1, Number(opts.parallel));
    let seq = 0;
    for (const name of opts.cases.split(',')) {
      const c = CASES[name];
      if (!c) throw new Error(`unknown case ${name}`);
      await cdp.send('Network.setExtraHTTPHeaders', { headers: c.cdpHeaders || {} });
      const results = [];
      for (let i = 0; i < n; i += par) {
        const batch = [];
        for (let j = i; j < Math.min(n, i + par); j++) {
          const url = `${origin.origin}/v1/chat/completions?case=${name}&i=${j}&r=${seq++}`;
          batch.push(page.evaluate(pageStream, { url, key: opts.key, maxTokens: Number(opts['max-tokens']), extraHeaders: c.extraHeaders, timeoutMs: Number(opts.timeout) }));
        }
        results.push(...await Promise.all(batch));
      }
      await page.waitForTimeout(200); // the last loadingFailed events
      for (const r of results) r.netError = netError.get(r.url) || null;
      const s = judge(name, results);
      failed += s.bad;
      summary.push(s);
    }
  } finally {
    await ctx.close();
    rmSync(userDataDir, { recursive: true, force: true });
  }
  console.log('\ncase      requests  clean  error  refused  not-h3  timing-missing  trailer-announced  comment');
  for (const s of summary) {
    console.log(`${s.name.padEnd(9)} ${String(s.n).padStart(8)} ${String(s.clean).padStart(6)} ${String(s.errors).padStart(6)} ${String(s.refused).padStart(8)} ${String(s.notH3).padStart(7)} ${String(s.noTiming).padStart(15)} ${String(s.announced).padStart(18)} ${String(s.comments).padStart(8)}`);
  }
  if (opts.netlog && existsSync(opts.netlog)) reportNetlog(opts.netlog);
  console.log(failed ? `\nFAIL: ${failed} request(s) did not end cleanly over h3 with timing` : '\nOK: every stream ended cleanly over h3');
  process.exitCode = failed ? 1 : 0;
}

// judge counts one case's results and prints every failure.
function judge(name, results) {
  const s = { name, n: results.length, clean: 0, errors: 0, refused: 0, notH3: 0, noTiming: 0, announced: 0, comments: 0, bad: 0 };
  const errs = new Map();
  for (const r of results) {
    const err = r.error && `${r.error} (${r.netError || 'no net error'})`;
    // Chromium refuses a request with TE before sending it
    // (net::ERR_INVALID_ARGUMENT): no stream, so nothing to judge.
    if (r.status === 0 && r.netError === 'net::ERR_INVALID_ARGUMENT') { s.refused++; errs.set(err, (errs.get(err) || 0) + 1); continue; }
    const h3 = r.nextHopProtocol === 'h3';
    const timing = opts.expect !== 'sluice' || (r.serverTiming || []).includes('ttft');
    if (r.ok) s.clean++; else { s.errors++; errs.set(err, (errs.get(err) || 0) + 1); }
    if (!h3) s.notH3++;
    if (!timing) s.noTiming++;
    if (r.trailerHeader) s.announced++;
    if (r.comment) s.comments++;
    if (!r.ok || !h3 || !timing) s.bad++;
  }
  if (name === 'comment' && opts.expect === 'sluice' && s.comments !== s.n) s.bad += s.n - s.comments;
  for (const [e, k] of errs) console.log(`  ${name}: ${k} x ${e}`);
  const afterDone = results.filter((r) => r.doneBeforeError).length;
  if (s.errors) console.log(`  ${name}: ${afterDone} of ${s.errors} errors came after the whole body, [DONE] included, had been read`);
  const ex = results.find((r) => r.ok) || results[0];
  if (ex) console.log(`  ${name} e.g.: status ${ex.status} proto ${ex.nextHopProtocol} reads ${ex.reads} bytes ${ex.bytes} trailer-header ${JSON.stringify(ex.trailerHeader)} serverTiming [${(ex.serverTiming || []).join(',')}]${ex.comment ? ' comment ' + JSON.stringify(ex.comment.slice(0, 60) + '...') : ''}`);
  return s;
}

// reportNetlog counts, from Chromium's own log, the HTTP/3 requests that
// carried "te: trailers" and the responses that carried trailers: what the
// browser really sent and received, below the page.
function reportNetlog(file) {
  let text = readFileSync(file, 'utf8');
  // A log cut short by the browser's exit lacks its closing brackets.
  if (!text.trimEnd().endsWith('}')) text = text.replace(/,\s*$/, '') + ']}';
  let log;
  try { log = JSON.parse(text); } catch (e) { console.log(`netlog: unreadable (${e.message})`); return; }
  const types = Object.fromEntries(Object.entries(log.constants.logEventTypes).map(([k, v]) => [v, k]));
  const count = new Map();
  let teSent = 0, teSentChat = 0;
  for (const ev of log.events) {
    const t = types[ev.type];
    count.set(t, (count.get(t) || 0) + 1);
    const h = ev.params && ev.params.headers;
    if (t === 'HTTP_TRANSACTION_QUIC_SEND_REQUEST_HEADERS') {
      const lines = Array.isArray(h) ? h : Object.entries(h || {}).map(([k, v]) => `${k}: ${v}`);
      if (lines.some((l) => /^te: trailers/i.test(l))) { teSent++; if (lines.some((l) => /chat\/completions/.test(l))) teSentChat++; }
    }
  }
  const pick = (re) => [...count].filter(([k]) => re.test(k || '')).map(([k, v]) => `${k}=${v}`).join(' ');
  console.log(`netlog: ${log.events.length} events; request headers with "te: trailers": ${teSent} (chat: ${teSentChat})`);
  console.log(`netlog: ${pick(/QUIC_SESSION_(CLOSED|PACKET_RECEIVED|CONNECTION_CLOSE)|TRAILER|QUIC_CHROMIUM_CLIENT_STREAM_READ/)}`);
}

main().catch((e) => { console.error(e); process.exitCode = 2; });
