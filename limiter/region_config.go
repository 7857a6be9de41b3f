package limiter

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// RegionConfig is the `region:` section: a tenant's global limits shared by
// several edge regions (region.go). The node's region is node.region, its
// regional Redis the `redis:` section; without a global store (the
// default) the node is single-region and nothing of this runs.
type RegionConfig struct {
	// Regions names every region sharing the global limits, this node's
	// among them; each is guaranteed its floor.
	Regions []string `yaml:"regions"`
	// GlobalStore is the Redis that holds the regions' shares (in a home
	// region; reached only by the rebalancer, never by an admission).
	GlobalStore RedisConfig `yaml:"global_store"`
	// Interval is the rebalancing period. Zero means 1s.
	Interval time.Duration `yaml:"interval"`
	// Hold is how long a region cut off from the global store keeps its
	// last share. Zero means 3×interval.
	Hold time.Duration `yaml:"hold"`
	// Decay is how long its share then takes to decay to its floor. Zero
	// means 20×interval.
	Decay time.Duration `yaml:"decay"`
	// MinShare is the fraction of an even split every region keeps
	// whatever the demand (its floor: min_share/len(regions)). Zero means
	// 0.2.
	MinShare float64 `yaml:"min_share"`
}

// Enabled reports whether the node shares global limits with other regions.
func (c RegionConfig) Enabled() bool { return c.GlobalStore.Enabled() }

// WithDefaults returns c with every zero field set to its default.
func (c RegionConfig) WithDefaults() RegionConfig {
	if !c.Enabled() {
		return c
	}
	o := RegionOptions{Interval: c.Interval, Hold: c.Hold, Decay: c.Decay, MinShare: c.MinShare, NodeID: "-"}.withDefaults()
	c.Interval, c.Hold, c.Decay, c.MinShare = o.Interval, o.Hold, o.Decay, o.MinShare
	c.GlobalStore = c.GlobalStore.WithDefaults()
	return c
}

// Validate reports every problem in c (after WithDefaults) for a node of
// region name, each naming the YAML field under region.
func (c RegionConfig) Validate(name string) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if !c.Enabled() {
		if len(c.Regions) > 0 {
			bad("global_store", "is required with regions (the Redis holding the regions' shares)")
		}
		return errors.Join(errs...)
	}
	if len(c.Regions) < 1 {
		bad("regions", "list every region sharing the global limits (node.region among them)")
	} else if !slices.Contains(c.Regions, name) {
		bad("regions", "node.region %q is not among %v", name, c.Regions)
	}
	seen := map[string]bool{}
	for i, r := range c.Regions {
		if r == "" || strings.Contains(r, "|") {
			bad(fmt.Sprintf("regions[%d]", i), "%q: a region name is not empty and has no '|'", r)
		}
		if seen[r] {
			bad(fmt.Sprintf("regions[%d]", i), "%q is listed twice", r)
		}
		seen[r] = true
	}
	if c.Interval < 10*time.Millisecond {
		bad("interval", "%v is too short (at least 10ms)", c.Interval)
	}
	if c.Hold < 0 || c.Decay < 0 {
		bad("hold", "hold and decay must not be negative")
	}
	if c.MinShare <= 0 || c.MinShare > 1 {
		bad("min_share", "must be in (0, 1], got %v", c.MinShare)
	}
	if err := c.GlobalStore.Validate(); err != nil {
		for _, e := range splitJoined(err) {
			if fe, ok := e.(*FieldError); ok {
				errs = append(errs, &FieldError{Field: "global_store." + fe.Field, Err: fe.Err})
			} else {
				errs = append(errs, fmt.Errorf("global_store: %w", e))
			}
		}
	}
	return errors.Join(errs...)
}

// NewRegionFromConfig wraps inner (the regional limiter) in a Region of
// name as cfg says, with a client for the global store: run its Run(ctx)
// and Close it at exit (which closes inner too).
func NewRegionFromConfig(inner Service, name string, cfg RegionConfig, log *slog.Logger) (*Region, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(name); err != nil {
		return nil, fmt.Errorf("region config: %w", err)
	}
	client, err := newUniversalClient(cfg.GlobalStore)
	if err != nil {
		return nil, fmt.Errorf("region config: global_store: %w", err)
	}
	r, err := NewRegion(inner, client, RegionOptions{Name: name, Regions: cfg.Regions, Interval: cfg.Interval,
		Hold: cfg.Hold, Decay: cfg.Decay, MinShare: cfg.MinShare, Logger: log})
	if err != nil {
		client.Close()
		return nil, err
	}
	r.closer = client.Close
	return r, nil
}

// splitJoined splits an errors.Join result into its parts.
func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
