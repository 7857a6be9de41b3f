// netlog-ends.mjs: how each streamed response ended, from a Chromium
// net-log (check-h3.mjs --netlog FILE).
//
// For every chat-completions request of the log it finds the QUIC packet
// that carried the stream's FIN, how many bytes of the stream that packet
// carried (the trailer's HEADERS frame alone is ~29 bytes; with the last
// events' DATA frames it is more; 0 is a FIN with no data), and whether the
// page's body read ended in a net error. It then counts the combinations:
// which endings Chromium survives.
//
// Usage: node netlog-ends.mjs FILE [-v]

import { readFileSync } from 'node:fs';

const [file, verbose] = process.argv.slice(2);
if (!file) {
  console.error('usage: node netlog-ends.mjs FILE [-v]');
  process.exit(2);
}
let text = readFileSync(file, 'utf8');
// A log cut short by the browser's exit lacks its closing brackets.
if (!text.trimEnd().endsWith('}')) text = text.replace(/,\s*$/, '') + ']}';
const log = JSON.parse(text);
const types = Object.fromEntries(Object.entries(log.constants.logEventTypes).map(([k, v]) => [v, k]));
const errors = Object.fromEntries(Object.entries(log.constants.netError).map(([k, v]) => [v, k]));

const requestOf = new Map(); // QUIC stream id -> URL request source id
const failed = new Map(); // URL request source id -> net error
const trailers = new Set(); // stream ids that received trailers
const frames = new Map(); // stream id -> [{packet, ms, length, fin}]
let packet = null;
let ms = 0;
for (const ev of log.events) {
  const t = types[ev.type];
  const p = ev.params || {};
  switch (t) {
    case 'HTTP_TRANSACTION_QUIC_SEND_REQUEST_HEADERS':
      if ((p.headers || []).some((h) => h.startsWith(':path: /v1/chat/completions'))) requestOf.set(p.quic_stream_id, ev.source.id);
      break;
    case 'HTTP_TRANSACTION_READ_BODY':
      if (ev.phase === 2 && p.net_error) failed.set(ev.source.id, errors[p.net_error] || p.net_error);
      break;
    case 'QUIC_SESSION_UNAUTHENTICATED_PACKET_HEADER_RECEIVED':
      packet = p.packet_number;
      ms = Number(ev.time);
      break;
    case 'QUIC_CHROMIUM_CLIENT_STREAM_READ_RESPONSE_TRAILERS':
      trailers.add(p.quic_stream_id);
      break;
    case 'QUIC_SESSION_STREAM_FRAME_RECEIVED': {
      if (!frames.has(p.stream_id)) frames.set(p.stream_id, []);
      frames.get(p.stream_id).push({ packet, ms, length: p.length, fin: p.fin });
      break;
    }
  }
}

const counts = new Map();
for (const [sid, src] of requestOf) {
  const fs = frames.get(sid) || [];
  const fin = fs.find((f) => f.fin);
  if (!fin) continue;
  const bytes = fs.filter((f) => f.packet === fin.packet).reduce((a, f) => a + f.length, 0);
  const prev = fs.filter((f) => f.packet !== fin.packet).pop();
  const err = failed.get(src);
  const key = `${err ? 'FAIL ' + err : 'ok'}; trailer: ${trailers.has(sid) ? 'yes' : 'no'}; bytes in the FIN packet: ${bytes}`;
  counts.set(key, (counts.get(key) || 0) + 1);
  if (verbose) console.log(`stream ${sid}: ${key}; FIN packet ${fin.packet}, previous packet ${prev ? prev.packet : '-'} ${prev ? fin.ms - prev.ms : '-'} ms before`);
}
for (const [k, n] of [...counts].sort()) console.log(`${String(n).padStart(4)}  ${k}`);
