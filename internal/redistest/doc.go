// Package redistest starts real redis-server processes for tests: a single
// server on a free loopback port (which can be killed, restarted on the same
// port, paused and resumed) and a real multi-primary Redis Cluster. Every
// process is private to the test that started it and is stopped in
// t.Cleanup, so tests of several packages can run in parallel.
package redistest
