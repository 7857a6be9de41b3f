package limiter

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"
)

// newUniversalClient builds the go-redis client of cfg (after WithDefaults
// and Validate) through redis.NewUniversalClient (go-redis v9.23.0,
// universal.go), which picks the client from the options:
//
//   - sentinel.master_name set: a FailoverClient (sentinel.go). Addrs are
//     the sentinels; the client asks them for the master's address,
//     subscribes to +switch-master and re-dials the new master after a
//     failover. Every command (the Lua scripts included) goes to the
//     master; a script missing on a freshly promoted replica is loaded by
//     redis.Script's EVALSHA-then-EVAL on NOSCRIPT.
//   - several addrs, or cluster: a ClusterClient; addrs are seeds.
//   - otherwise: a single-node Client.
//
// Username and Password authenticate to the data nodes (Redis 6 ACL);
// sentinel.username and sentinel.password to the sentinels.
func newUniversalClient(cfg RedisConfig) (redis.UniversalClient, error) {
	return newWatchedClient(cfg, nil)
}

// newWatchedClient is newUniversalClient with w told of every new
// connection's server (resettle.go), except on a Cluster, whose nodes all
// differ. w may be nil.
func newWatchedClient(cfg RedisConfig, w *serverWatch) (redis.UniversalClient, error) {
	tlsConf, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	opt := &redis.UniversalOptions{
		Addrs: cfg.Addrs, IsClusterMode: cfg.Cluster,
		Username: cfg.Username, Password: cfg.Password, TLSConfig: tlsConf,
		DialTimeout: cfg.DialTimeout, ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.WriteTimeout,
		PoolSize: cfg.PoolSize, ContextTimeoutEnabled: true,
	}
	if w != nil && !cfg.Cluster && (len(cfg.Addrs) <= 1 || cfg.Sentinel.MasterName != "") {
		opt.OnConnect = w.onConnect
	}
	if cfg.Sentinel.MasterName != "" {
		opt.Addrs = cfg.Sentinel.Addrs
		opt.MasterName = cfg.Sentinel.MasterName
		opt.SentinelUsername = cfg.Sentinel.Username
		opt.SentinelPassword = cfg.Sentinel.Password
	}
	return redis.NewUniversalClient(opt), nil
}

// tlsConfig is the TLS configuration of cfg: nil without tls; else TLS 1.2+
// verifying the servers against tls_ca_file (the system roots when empty),
// presenting tls_cert_file/tls_key_file when set, and checking the name
// tls_server_name (when empty, crypto/tls takes each node's host from the
// address it dials: a certificate must then carry that name or IP).
func (c RedisConfig) tlsConfig() (*tls.Config, error) {
	if !c.TLS {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, &FieldError{Field: "tls_ca_file", Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &FieldError{Field: "tls_ca_file", Err: fmt.Errorf("%s holds no PEM certificate", c.TLSCAFile)}
		}
		conf.RootCAs = pool
	}
	if c.TLSCertFile != "" || c.TLSKeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, &FieldError{Field: "tls_cert_file", Err: err}
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// FieldError is one problem of a RedisConfig, about the YAML field Field
// (relative to the redis section: "addrs[1]", "sentinel.master_name").
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }
