// Package ws holds Sluice's WebSocket plumbing: the settings of the bridge
// endpoint and of passthrough routes (Config), the upgrader, the origin
// check, API keys carried as a subprotocol, close frames, and the
// passthrough relay that copies frames both ways between a client and a
// backend socket (Relay). The request pipeline (package proxy) and the
// bridge (package proxy/bridge) build on it.
package ws
