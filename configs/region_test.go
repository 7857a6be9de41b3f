package configs

import (
	"strings"
	"testing"
	"time"
)

// regionYAML is a valid multi-region config: node region fra, its
// regional Redis, and the global store.
const regionYAML = valid + `node: {name: n1, region: fra}
redis: {addrs: ["127.0.0.1:6379"]}
region:
  regions: [fra, iad, sin]
  global_store: {addrs: ["10.0.0.1:6379"]}
`

func TestRegionConfigDefaults(t *testing.T) {
	c, err := Parse("sluice.yaml", []byte(regionYAML))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Region
	if !r.Enabled() || r.Interval != time.Second || r.Hold != 3*time.Second || r.Decay != 20*time.Second || r.MinShare != 0.2 {
		t.Errorf("region defaults = %+v", r)
	}
	if r.GlobalStore.AdmissionTimeout == 0 {
		t.Errorf("global_store has no defaults: %+v", r.GlobalStore)
	}
}

func TestRegionConfigDefaultIsSingleRegion(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if c.Region.Enabled() || len(c.Region.Regions) > 0 {
		t.Errorf("the embedded default has a region section: %+v", c.Region)
	}
}

func TestRegionConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"not listed", strings.Replace(regionYAML, "[fra, iad, sin]", "[iad, sin]", 1), `12:12: region: regions: node.region "fra" is not among`},
		{"no regional redis", strings.Replace(regionYAML, `redis: {addrs: ["127.0.0.1:6379"]}`, "", 1), "needs the regional redis"},
		{"no global store", strings.Replace(regionYAML, `  global_store: {addrs: ["10.0.0.1:6379"]}`, "", 1), "global_store: is required with regions"},
		{"twice", strings.Replace(regionYAML, "[fra, iad, sin]", "[fra, iad, fra]", 1), `"fra" is listed twice`},
		{"min share", regionYAML + "  min_share: 1.5\n", "min_share: must be in (0, 1]"},
		{"interval", regionYAML + "  interval: 1ms\n", "interval: 1ms is too short"},
		{"global addr", strings.Replace(regionYAML, "10.0.0.1:6379", "nohost", 1), "global_store.addrs[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("sluice.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v; want it to contain %q", err, tc.want)
			}
		})
	}
}

// The global store's password is a secret like redis.password: redacted
// in the config's text.
func TestRegionConfigPasswordRedacted(t *testing.T) {
	c, err := Parse("sluice.yaml", []byte(strings.Replace(regionYAML, `{addrs: ["10.0.0.1:6379"]}`,
		`{addrs: ["10.0.0.1:6379"], password: hunter2}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if c.Region.GlobalStore.Password != "hunter2" {
		t.Fatalf("password = %q", c.Region.GlobalStore.Password)
	}
	if strings.Contains(string(c.RedactedText()), "hunter2") {
		t.Errorf("the global store's password is in the redacted text:\n%s", c.RedactedText())
	}
}
