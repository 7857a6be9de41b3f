// Package observe turns finished requests into what operators read:
// Prometheus metrics, the sliding-window percentiles behind /debug/stats
// and the status page, the access log line, and the admin listener's
// handler. The pipeline describes each finished request once, as a Record;
// everything here reads that record and nothing of the pipeline.
package observe
