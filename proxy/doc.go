// Package proxy is Sluice's request pipeline: listeners (TCP, TLS and
// HTTP/3 over QUIC), intake, tenant authentication, admission, backend
// selection, forwarding and relaying of SSE streams, timing headers, the
// error-to-status mapping and the access log.
package proxy
