package configs

import "testing"

// The redis: section's topologies (issue 19 item 4): a Sentinel block
// decodes, and every mistake in it is reported at its own line and column.
func TestRedisSentinelConfig(t *testing.T) {
	y := valid + `redis:
  sentinel:
    master_name: sluice
    addrs: [127.0.0.1:26379, 127.0.0.1:26380]
    username: sentinel-user
    password: sentinel-pw
  username: sluice
  password: data-pw
`
	c, err := Parse("t.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Redis.Sentinel
	if !c.Redis.Enabled() || s.MasterName != "sluice" || len(s.Addrs) != 2 || s.Username != "sentinel-user" ||
		s.Password != "sentinel-pw" || c.Redis.Username != "sluice" {
		t.Fatalf("decoded redis %+v", c.Redis)
	}
	if r, err := Parse("t.yaml", c.RedactedText()); err != nil || r.Redis.Sentinel.Password != Redacted {
		t.Errorf("redacted sentinel password %q, %v; want %q", r.Redis.Sentinel.Password, err, Redacted)
	}
}

func TestRedisTopologyErrorsHaveLineAndColumn(t *testing.T) {
	wantErrors(t, valid+"redis:\n  sentinel:\n    addrs: [127.0.0.1:26379, nowhere]\n",
		`11:5: redis: sentinel.master_name: is required`, `11:30: redis: sentinel.addrs[1]: "nowhere" is not host:port`)
	wantErrors(t, valid+"redis:\n  cluster: true\n  addrs: [127.0.0.1:7000]\n  sentinel:\n    master_name: m\n    addrs: [127.0.0.1:26379]\n",
		`10:12: redis: cluster: cluster and sentinel are exclusive`, `11:10: redis: addrs: must be empty with sentinel`)
	wantErrors(t, valid+"redis:\n  addrs: [127.0.0.1:6379]\n  tls_ca_file: /etc/ca.pem\n",
		`11:16: redis: tls_ca_file: is set but tls is false`)
	wantErrors(t, valid+"redis:\n  addrs: [127.0.0.1:6379]\n  tls: true\n  tls_ca_file: /nonexistent/ca.pem\n",
		`12:16: redis: tls_ca_file: open /nonexistent/ca.pem`)
}
