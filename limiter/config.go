package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// RedisConfig is the `redis:` section of the configuration. Without it
// (no addresses) Sluice uses the Local limiter alone.
type RedisConfig struct {
	// Addrs are host:port addresses. One address means a single Redis
	// server; several mean a Redis Cluster (the addresses are seeds).
	Addrs []string `yaml:"addrs"`
	// Cluster forces cluster mode with a single seed address.
	Cluster bool `yaml:"cluster"`
	// Username and Password authenticate (Redis 6 ACL; Password alone for
	// requirepass). Empty means none.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// PasswordFile names a file holding the password instead (read by
	// the configs package on load and reload; docs/OPERATIONS.md
	// "Secrets"). Empty means none.
	PasswordFile string `yaml:"password_file"`
	// TLS connects with TLS (system roots; each server's name is taken from
	// its address).
	TLS bool `yaml:"tls"`
	// TLSCAFile is a PEM file of the CAs that sign the servers'
	// certificates (instead of the system roots); TLSCertFile and
	// TLSKeyFile a client certificate (tls-auth-clients); TLSServerName
	// the name checked in every server's certificate instead of the host
	// dialled. Each needs tls: true.
	TLSCAFile     string `yaml:"tls_ca_file"`
	TLSCertFile   string `yaml:"tls_cert_file"`
	TLSKeyFile    string `yaml:"tls_key_file"`
	TLSServerName string `yaml:"tls_server_name"`
	// Sentinel, with a master name, finds the master through Redis
	// Sentinel (addrs is then empty): see SentinelConfig.
	Sentinel SentinelConfig `yaml:"sentinel"`
	// DialTimeout, ReadTimeout and WriteTimeout bound network operations.
	// Zero means 1s, 500ms and 500ms.
	DialTimeout  time.Duration `yaml:"dial_timeout"`
	ReadTimeout  time.Duration `yaml:"read_timeout"`
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// AdmissionTimeout bounds one admission in Redis before the
	// store-failure policy decides (a slow Redis is waited for up to it;
	// Redis drops an admission that reaches it later). Zero means 500ms.
	AdmissionTimeout time.Duration `yaml:"admission_timeout"`
	// SettleTimeout bounds one settle in Redis; a settle that fails or
	// times out is retried by the heartbeat. Zero means 250ms.
	SettleTimeout time.Duration `yaml:"settle_timeout"`
	// PoolSize is the number of connections per Redis server. Zero means
	// go-redis' default (10 per GOMAXPROCS).
	PoolSize int `yaml:"pool_size"`
	// LeaseTTL is the life of an unrenewed concurrency lease: a crashed
	// node's slots come back within it. Zero means 30s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Heartbeat is the lease renewal period. Zero means LeaseTTL/3.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// Nodes is the expected number of edge nodes; under the local
	// store-failure policy each enforces 1/Nodes of every limit. Zero means
	// the number of live nodes seen through Redis.
	Nodes int `yaml:"nodes"`
	// BreakerFailures is the number of consecutive failures that open the
	// circuit breaker. Zero means 3.
	BreakerFailures int `yaml:"breaker_failures"`
	// BreakerCooldown is how long the breaker stays open before probing
	// Redis again. Zero means 1s.
	BreakerCooldown time.Duration `yaml:"breaker_cooldown"`
}

// SentinelConfig is `redis.sentinel`: a master and its replicas watched by
// Redis Sentinel. The client asks the sentinels for the master, follows it
// through failovers, and sends everything to the master.
type SentinelConfig struct {
	// MasterName is the name the sentinels monitor (`sentinel monitor
	// NAME ...`).
	MasterName string `yaml:"master_name"`
	// Addrs are the sentinels' host:port addresses (26379 by default in
	// Redis); list several, any of them answers.
	Addrs []string `yaml:"addrs"`
	// Username and Password authenticate to the sentinels (their own ACL
	// or requirepass); the data nodes use redis.username and
	// redis.password.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// Enabled reports whether a Redis store is configured.
func (c RedisConfig) Enabled() bool {
	return len(c.Addrs) > 0 || c.Sentinel.MasterName != "" || len(c.Sentinel.Addrs) > 0
}

// WithDefaults returns c with every zero field set to its default.
func (c RedisConfig) WithDefaults() RedisConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DialTimeout, time.Second)
	def(&c.ReadTimeout, 500*time.Millisecond)
	def(&c.WriteTimeout, 500*time.Millisecond)
	def(&c.AdmissionTimeout, 500*time.Millisecond)
	def(&c.SettleTimeout, 250*time.Millisecond)
	def(&c.LeaseTTL, 30*time.Second)
	def(&c.Heartbeat, c.LeaseTTL/3)
	def(&c.BreakerCooldown, time.Second)
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 3
	}
	return c
}

// Validate reports every problem in c (after WithDefaults), each naming the
// YAML field.
func (c RedisConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if sn := c.Sentinel; sn.MasterName != "" || len(sn.Addrs) > 0 {
		if sn.MasterName == "" {
			bad("sentinel.master_name", "is required with sentinel.addrs (the name the sentinels monitor)")
		}
		if len(sn.Addrs) == 0 {
			bad("sentinel.addrs", "at least one sentinel host:port is required with sentinel.master_name")
		}
		for i, a := range sn.Addrs {
			if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
				bad(fmt.Sprintf("sentinel.addrs[%d]", i), "%q is not host:port", a)
			}
		}
		if len(c.Addrs) > 0 {
			bad("addrs", "must be empty with sentinel (the sentinels name the master; list them in sentinel.addrs)")
		}
		if c.Cluster {
			bad("cluster", "cluster and sentinel are exclusive (a Cluster fails over by itself)")
		}
	} else if len(c.Addrs) == 0 {
		bad("addrs", "at least one host:port is required")
	}
	if !c.TLS {
		for _, f := range []struct{ field, v string }{{"tls_ca_file", c.TLSCAFile}, {"tls_cert_file", c.TLSCertFile},
			{"tls_key_file", c.TLSKeyFile}, {"tls_server_name", c.TLSServerName}} {
			if f.v != "" {
				bad(f.field, "is set but tls is false (set tls: true)")
			}
		}
	} else if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("tls_cert_file", "tls_cert_file and tls_key_file go together (a client certificate and its key)")
	} else if _, err := c.tlsConfig(); err != nil {
		errs = append(errs, err)
	}
	for i, a := range c.Addrs {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			bad(fmt.Sprintf("addrs[%d]", i), "%q is not host:port", a)
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"dial_timeout", c.DialTimeout}, {"read_timeout", c.ReadTimeout}, {"write_timeout", c.WriteTimeout},
		{"admission_timeout", c.AdmissionTimeout}, {"settle_timeout", c.SettleTimeout}, {"lease_ttl", c.LeaseTTL}, {"heartbeat", c.Heartbeat},
		{"breaker_cooldown", c.BreakerCooldown}} {
		if d.v < 0 {
			bad(d.field, "must not be negative, got %v", d.v)
		}
	}
	if c.Heartbeat >= c.LeaseTTL && c.LeaseTTL > 0 {
		bad("heartbeat", "%v must be shorter than lease_ttl %v (leases would expire between beats)", c.Heartbeat, c.LeaseTTL)
	}
	if c.LeaseTTL > 0 && c.LeaseTTL < 100*time.Millisecond {
		bad("lease_ttl", "%v is too short (at least 100ms)", c.LeaseTTL)
	}
	if c.PoolSize < 0 {
		bad("pool_size", "must not be negative, got %d", c.PoolSize)
	}
	if c.Nodes < 0 {
		bad("nodes", "must not be negative, got %d", c.Nodes)
	}
	if c.BreakerFailures < 0 {
		bad("breaker_failures", "must not be negative, got %d", c.BreakerFailures)
	}
	return errors.Join(errs...)
}

// ValidatePolicy checks a Limits.OnStoreFailure value.
func ValidatePolicy(p string) error {
	switch p {
	case "", PolicyLocal, PolicyOpen, PolicyClosed:
		return nil
	}
	return fmt.Errorf("on_store_failure: %q is not one of local, open, closed", p)
}

// NewFromConfig connects to Redis as cfg says and returns the Shared
// limiter: run its Run(ctx) for the heartbeat and Close it at exit. Before
// it returns it warms the client up (warmUp: a few connections per server
// open, every script loaded), within dial_timeout + read_timeout. Redis
// being unreachable at start is not an error (the store-failure policies
// apply until it answers); it is logged, and Warm reports false. reg and log may be nil.
func NewFromConfig(cfg RedisConfig, reg prometheus.Registerer, log *slog.Logger) (*Shared, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("redis config: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	SetRedisLogger(log)
	watch := newServerWatch()
	client, err := newWatchedClient(cfg, watch)
	if err != nil {
		return nil, fmt.Errorf("redis config: %w", err)
	}
	store := NewRedis(client, RedisOptions{LeaseTTL: cfg.LeaseTTL, Heartbeat: cfg.Heartbeat})
	store.watch = watch
	s := NewShared(store,
		SharedOptions{AdmissionTimeout: cfg.AdmissionTimeout, SettleTimeout: cfg.SettleTimeout, FailureThreshold: cfg.BreakerFailures,
			Cooldown: cfg.BreakerCooldown, Nodes: cfg.Nodes, Registerer: reg, Logger: log})
	s.closer = client.Close
	// The warm-up (warmup.go): connections and scripts ready before the
	// first admissions, bounded by one dial and one read, as the Ping it
	// replaces was by the dial: Redis being down does not hold the start.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout+cfg.ReadTimeout)
	defer cancel()
	var se *scriptsError
	switch err := warmUp(ctx, client, warmConns(cfg.PoolSize)); {
	case err == nil:
		s.warm.Store(true)
	case errors.As(err, &se):
		s.warm.Store(true) // reachable; the scripts load on first use
		log.Warn("limiter: scripts not loaded at start (does the ACL user have +script|load?); they load on first use",
			"err", err)
	default:
		log.Warn("limiter: redis not reachable at start; store-failure policies apply until it is",
			"addrs", cfg.Addrs, "sentinels", cfg.Sentinel.Addrs, "err", err)
	}
	return s, nil
}

// NewClient returns a Redis client for cfg (defaults applied), with the
// limiter's settings (topology, TLS, context deadlines honoured), for other
// users of the node's Redis (the routing's shared prefix table).
func NewClient(cfg RedisConfig) (redis.UniversalClient, error) {
	return newUniversalClient(cfg.WithDefaults())
}
