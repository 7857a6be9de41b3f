package limiter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

func TestRedisConfigDefaults(t *testing.T) {
	c := RedisConfig{Addrs: []string{"127.0.0.1:6379"}}.WithDefaults()
	if c.AdmissionTimeout != 500*time.Millisecond || c.LeaseTTL != 30*time.Second ||
		c.Heartbeat != 10*time.Second || c.BreakerFailures != 3 || c.BreakerCooldown != time.Second {
		t.Errorf("defaults = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(defaults) = %v", err)
	}
	c = RedisConfig{Addrs: []string{"x"}, LeaseTTL: 2 * time.Second}.WithDefaults()
	if c.Heartbeat != 2*time.Second/3 {
		t.Errorf("heartbeat default = %v; want lease_ttl/3", c.Heartbeat)
	}
}

func TestRedisConfigValidate(t *testing.T) {
	c := RedisConfig{
		Addrs:     []string{"127.0.0.1:6379", "nohost", ":7000"},
		LeaseTTL:  time.Second,
		Heartbeat: 2 * time.Second,
		PoolSize:  -1,
		Nodes:     -2,
	}.WithDefaults()
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, want := range []string{"addrs[1]", "addrs[2]", "heartbeat", "pool_size", "nodes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "addrs[0]") {
		t.Errorf("error %q blames a good address", err)
	}
	if err := (RedisConfig{}).WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "addrs") {
		t.Errorf("empty addrs: %v; want an addrs error", err)
	}
	if ValidatePolicy("local") != nil || ValidatePolicy("") != nil || ValidatePolicy("sometimes") == nil {
		t.Error("ValidatePolicy misjudges")
	}
}

func TestNewFromConfig(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	reg := prometheus.NewRegistry()
	// Generous store timeouts: this tests the shared path, which a starved
	// CPU must not turn into degraded decisions. Three beats per TTL.
	const ttl = 2 * time.Second
	s, err := NewFromConfig(RedisConfig{Addrs: []string{srv.Addr()}, LeaseTTL: ttl,
		AdmissionTimeout: storeTimeout, DialTimeout: storeTimeout, ReadTimeout: storeTimeout,
		WriteTimeout: storeTimeout}, reg, nil)
	if err != nil {
		t.Fatalf("NewFromConfig: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	lim := Limits{MaxConcurrency: 1}
	d := admit(t, s, Request{Tenant: "cfg", Limits: lim})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want a shared admission", d)
	}
	// Real time past the TTL on Redis's clock (TIME expires leases): no
	// event to wait on. Only the heartbeat can keep the lease.
	time.Sleep(3 * ttl / 2)
	if st := snapshot(t, s, "cfg", lim); st.InFlight != 1 || st.Degraded {
		t.Errorf("status %+v; want the lease kept by Run", st)
	}
	settle(t, s, d.Ticket, Usage{})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := NewFromConfig(RedisConfig{Addrs: []string{"bad"}}, nil, nil); err == nil {
		t.Error("NewFromConfig accepted a bad address")
	}
}

func TestNewFromConfigCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	s, err := NewFromConfig(RedisConfig{Addrs: c.Addrs(), AdmissionTimeout: storeTimeout,
		DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout}, nil, nil)
	if err != nil {
		t.Fatalf("NewFromConfig: %v", err)
	}
	defer s.Close()
	for i := 0; i < 3; i++ {
		d := admit(t, s, Request{Tenant: "cluster-cfg", Limits: Limits{MaxConcurrency: 2}})
		if d.Degraded || d.Allowed != (i < 2) {
			t.Errorf("admission %d: %+v; want shared, 2 of 3 admitted", i, d)
		}
	}
	beat(t, s.Store())
}

func TestLimitsValidate(t *testing.T) {
	good := Limits{MaxConcurrency: 8, TokensPerMinute: 20000, RequestsPerMinute: 120,
		Models: map[string]Limits{"big": {MaxConcurrency: 1}}, OnStoreFailure: "closed"}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate(good) = %v", err)
	}
	bad := Limits{MaxConcurrency: -1, Burst: -5, OnStoreFailure: "maybe",
		Models: map[string]Limits{"m": {TokensPerMinute: -1, Models: map[string]Limits{"x": {}}}}}
	err := bad.Validate()
	for _, want := range []string{"max_concurrency", "burst", "on_store_failure", "models.m.tokens_per_minute", "models.m.models"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(bad) = %v; want it to name %s", err, want)
		}
	}
}

func TestLimitsValidateCharges(t *testing.T) {
	ok := Limits{MaxTokens: 4096, MaxTokensPolicy: MaxTokensClamp, ChargePrefill: PrefillFirstToken}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v", ok, err)
	}
	bad := Limits{MaxTokens: -1, MaxTokensPolicy: "trim", Models: map[string]Limits{"m": {ChargePrefill: "later"}}}
	err := bad.Validate()
	for _, want := range []string{"max_tokens: must not be negative", "max_tokens_policy", "models.m.charge_prefill"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(bad) = %v; want it to name %q", err, want)
		}
	}
}
