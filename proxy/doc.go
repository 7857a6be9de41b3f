// Package proxy is Sluice's request pipeline: listeners, intake, tenant
// authentication, admission, backend selection, forwarding and relaying of
// SSE streams, timing headers, the error-to-status mapping and the access log.
package proxy
