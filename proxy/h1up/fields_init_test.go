package h1up

import "os"

// h1up's tests read response fields with readFields (off by default in
// the binary) unless SLUICE_H1UP_FIELDS=textproto says otherwise.
func init() { ownFields = os.Getenv("SLUICE_H1UP_FIELDS") != "textproto" }
