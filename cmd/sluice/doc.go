// Command sluice is an edge proxy for streaming LLM inference.
//
// Run it without arguments to serve the embedded default configuration, or
// see "sluice -help" for the subcommands (serve, check, sim, bench,
// diagnose, hash-key, version).
package main
