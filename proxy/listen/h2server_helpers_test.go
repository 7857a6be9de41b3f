package listen_test

import "os"

// testH2Server is the HTTP/2 server of the test listeners:
// SLUICE_TEST_H2_SERVER=go runs the package's h2 tests against net/http's
// server (listen.H2ServerGo); unset, Sluice's own (the default).
var testH2Server = os.Getenv("SLUICE_TEST_H2_SERVER")
