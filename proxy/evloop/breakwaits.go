package evloop

import "golang.org/x/sys/unix"

// BreakWaits makes every loop fail as a broken epoll set would, and
// returns once all have stopped: on each loop's goroutine its epoll
// descriptor is replaced by one of /dev/null (dup3), so that its next
// epoll_wait fails with EINVAL (see loop.fail), as
// TestWaitFailureEndsTheLoop does to one loop. It is for the tests of the
// packages above (proxy) that must meet a loop failure; nothing else
// calls it.
func (g *Group) BreakWaits() {
	for _, l := range g.loops {
		l.command(func() {
			null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return
			}
			unix.Dup3(null, l.epfd, unix.O_CLOEXEC)
			unix.Close(null)
		})
	}
	g.wg.Wait()
}
