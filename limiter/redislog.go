package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisLogger routes go-redis' own log lines (failed dials, pool events)
// through slog, so that they appear as structured records in the JSON log
// instead of bare text lines.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "detail", strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// SetRedisLogger sends go-redis' log lines to log (go-redis has one global
// logger; the last call wins). NewFromConfig calls it with its logger.
func SetRedisLogger(log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	redis.SetLogger(redisLogger{log: log})
}
