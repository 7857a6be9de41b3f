package limiter

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one file each under lua/. redis.Script runs them with
// EVALSHA and falls back to EVAL on NOSCRIPT (a restarted or flushed
// server).
var (
	//go:embed lua/admit.lua
	admitLua string
	//go:embed lua/settle.lua
	settleLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/status.lua
	statusLua string
	//go:embed lua/nodes.lua
	nodesLua string

	admitScript  = redis.NewScript(admitLua)
	settleScript = redis.NewScript(settleLua)
	renewScript  = redis.NewScript(renewLua)
	statusScript = redis.NewScript(statusLua)
	nodesScript  = redis.NewScript(nodesLua)
)
