// Package listen serves an http.Handler on Sluice's listeners: cleartext
// HTTP/1.1 and h2c, TLS HTTP/1.1 and HTTP/2 (handshakes timed on their own
// goroutines), HTTP/3 over QUIC with Alt-Svc and 0-RTT policy, and the
// admin listener; it records each connection's facts (protocol, handshake
// time, RTT from TCP_INFO or QUIC) for the request pipeline (ConnInfoFrom)
// and drains in stages on Shutdown.
package listen
