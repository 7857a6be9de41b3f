// Package filewatch calls a function when files in some directories change:
// one fsnotify watcher, one debouncer, and an optional poll for file
// systems whose events cannot be trusted.
//
// It watches directories, not files: editors save by renaming a new file
// over the old one and Kubernetes swaps a "..data" symlink, neither of
// which a watch on the file itself sees. What changed is left to the
// caller's Check, which compares content, so unrelated events in the
// directories cost one look at the files and a broken file is tried once.
package filewatch
