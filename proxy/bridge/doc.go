// Package bridge serves Sluice's WebSocket bridge: a client opens a socket
// on the bridge endpoint (ws.Config.Path), sends JSON request frames, each
// an OpenAI request with a client id, and receives chunk frames, a done
// frame (usage and timing) or an error frame per request, several requests
// in flight on one socket, each cancellable. Each request frame runs
// through the pipeline's entry point, proxy.Handler.Serve, with a Sink that
// turns the response into frames; the backend is spoken to in SSE.
//
// A Bridge wraps a proxy.Handler as an http.Handler: it serves the bridge
// endpoint and passes every other request to the handler. The protocol is
// described in docs/WEBSOCKET.md.
package bridge
