//go:build !linux

package h1up

type prober struct{}

func (c *conn) initProbe() {}

// alive assumes an idle connection is alive where no cheap check is
// implemented; a request that fails on it is retried by RoundTrip's rule.
func (c *conn) alive() bool { return true }

var sendWaitOn = false

// canSendWait: no sendWait outside Linux; requests go through the net.Conn.
func (c *conn) canSendWait() bool { return false }

func (c *conn) sendWait(out []byte) (int, bool, error) { panic("h1up: sendWait") }
