package proxy_test

import "os"

// testH2Server is the HTTP/2 server of every test listener:
// SLUICE_TEST_H2_SERVER=sluice runs the package's h2 tests against
// Sluice's own (listen.H2ServerSluice); unset, net/http's.
var testH2Server = os.Getenv("SLUICE_TEST_H2_SERVER")
