// Package deploy holds Sluice's packaging (Dockerfile, systemd unit,
// Kubernetes manifests); this test checks the manifests against Sluice
// itself: the ports it serves, the admin paths its probes ask for, its
// drain timings, and its config loader.
package deploy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// The parts of the Kubernetes objects the test reads (field names as in
// the Kubernetes API reference, apps/v1, v1, policy/v1).
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"` // ConfigMap
	Spec struct {
		// Deployment
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		// Service
		Type                  string            `yaml:"type"`
		ExternalTrafficPolicy string            `yaml:"externalTrafficPolicy"`
		ServiceSelector       map[string]string `yaml:"-"`
		Ports                 []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
			Protocol   string `yaml:"protocol"`
		} `yaml:"ports"`
		// PodDisruptionBudget
		MaxUnavailable *int `yaml:"maxUnavailable"`
		MinAvailable   *int `yaml:"minAvailable"`
	} `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
	Containers []struct {
		Name  string   `yaml:"name"`
		Image string   `yaml:"image"`
		Args  []string `yaml:"args"`
		Env   []struct {
			Name  string `yaml:"name"`
			Value string `yaml:"value"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
			Protocol      string `yaml:"protocol"`
		} `yaml:"ports"`
		ReadinessProbe *probe `yaml:"readinessProbe"`
		LivenessProbe  *probe `yaml:"livenessProbe"`
		Lifecycle      struct {
			PreStop *struct {
				Sleep *struct {
					Seconds int `yaml:"seconds"`
				} `yaml:"sleep"`
			} `yaml:"preStop"`
		} `yaml:"lifecycle"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	} `yaml:"containers"`
	Volumes []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
	} `yaml:"volumes"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

// readManifests parses every deploy/**/*.yaml document.
func readManifests(t *testing.T) map[string]*object {
	t.Helper()
	byKind := map[string]*object{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range splitDocs(data) {
			var o object
			if err := yaml.Unmarshal(doc, &o); err != nil {
				t.Errorf("%s document %d: %v", path, i, err)
				continue
			}
			var sel struct {
				Spec struct {
					Selector map[string]any `yaml:"selector"`
				} `yaml:"spec"`
			}
			yaml.Unmarshal(doc, &sel)
			if o.Kind == "Service" {
				o.Spec.ServiceSelector = map[string]string{}
				for k, v := range sel.Spec.Selector {
					s, _ := v.(string)
					o.Spec.ServiceSelector[k] = s
				}
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s document %d: apiVersion, kind and metadata.name are required: %+v", path, i, o)
				continue
			}
			if byKind[o.Kind] != nil {
				t.Errorf("%s: a second %s (the test expects one of each)", path, o.Kind)
			}
			byKind[o.Kind] = &o
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return byKind
}

func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

// The manifests hold a Deployment, a Service, a ConfigMap and a
// PodDisruptionBudget that agree with each other and with Sluice: ports
// TCP 8080, TCP+UDP 8443 and the admin port of the config; probes on admin
// paths Sluice serves without a token; a grace period covering preStop and
// the config's drain; the config loads as `sluice check` loads it, with
// every file it names under a mounted volume.
func TestKubernetesManifests(t *testing.T) {
	objs := readManifests(t)
	for _, kind := range []string{"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} {
		if objs[kind] == nil {
			t.Fatalf("no %s in deploy/", kind)
		}
	}
	dep, svc, cm, pdb := objs["Deployment"], objs["Service"], objs["ConfigMap"], objs["PodDisruptionBudget"]
	labels := dep.Spec.Template.Metadata.Labels
	for what, sel := range map[string]map[string]string{"Deployment selector": dep.Spec.Selector.MatchLabels,
		"Service selector": svc.Spec.ServiceSelector, "PodDisruptionBudget selector": pdb.Spec.Selector.MatchLabels} {
		if len(sel) == 0 {
			t.Errorf("%s is empty", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s %s=%s does not match the pod's labels %v", what, k, v, labels)
			}
		}
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Error("PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}
	if r := dep.Spec.Replicas; r == nil || *r < 2 {
		t.Error("Deployment: fewer than 2 replicas (the PodDisruptionBudget could block every eviction)")
	}

	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment: %d containers; want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !pod.SecurityContext.RunAsNonRoot || c.SecurityContext.AllowPrivilegeEscalation == nil ||
		*c.SecurityContext.AllowPrivilegeEscalation || !c.SecurityContext.ReadOnlyRootFilesystem {
		t.Error("Deployment: want runAsNonRoot, allowPrivilegeEscalation false, readOnlyRootFilesystem")
	}
	ports := map[string]int{} // name → port
	have := map[string]bool{} // "8443/UDP"
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
		have[strconv.Itoa(p.ContainerPort)+"/"+p.Protocol] = true
	}
	for _, want := range []string{"8080/TCP", "8443/TCP", "8443/UDP"} {
		if !have[want] {
			t.Errorf("Deployment: container port %s missing (have %v)", want, have)
		}
	}
	svcHave := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		svcHave[strconv.Itoa(p.Port)+"/"+p.Protocol] = true
		if _, ok := ports[p.TargetPort]; !ok {
			t.Errorf("Service port %s: targetPort %q is not a named container port", p.Name, p.TargetPort)
		}
	}
	for _, want := range []string{"8080/TCP", "8443/TCP", "8443/UDP"} {
		if !svcHave[want] {
			t.Errorf("Service: port %s missing (have %v)", want, svcHave)
		}
	}

	// The config: SLUICE_CONFIG names the ConfigMap's key under its mount.
	mounts := map[string]string{} // volume name → mount path
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	var cfgPath string
	for _, e := range c.Env {
		if e.Name == "SLUICE_CONFIG" {
			cfgPath = e.Value
		}
	}
	var cfgVolume string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name {
			cfgVolume = v.Name
		}
	}
	key := filepath.Base(cfgPath)
	if cfgVolume == "" || filepath.Dir(cfgPath) != mounts[cfgVolume] || cm.Data[key] == "" {
		t.Fatalf("SLUICE_CONFIG %q is not a key of ConfigMap %s mounted by the Deployment (mounts %v)", cfgPath, cm.Metadata.Name, mounts)
	}
	text := cm.Data[key]
	cfg := loadConfigMap(t, text, mounts)

	// Probes: on the config's admin port, paths Sluice's admin handler
	// serves without the token; /readyz fails once the node drains.
	_, adminPort, _ := net.SplitHostPort(cfg.Listeners.Admin)
	if strconv.Itoa(ports["admin"]) != adminPort {
		t.Errorf("container port admin %d is not listeners.admin %q", ports["admin"], cfg.Listeners.Admin)
	}
	draining := false
	admin := observe.NewAdmin(prometheus.NewRegistry(), func() bool { return draining }, func() observe.StatsSnapshot { return observe.StatsSnapshot{} })
	get := func(path string) int {
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	for name, p := range map[string]*probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("Deployment: no %s httpGet", name)
			continue
		}
		if p.HTTPGet.Port != "admin" {
			t.Errorf("%s on port %q; want the admin port", name, p.HTTPGet.Port)
		}
		if !slices.Contains(observe.OpenPaths, p.HTTPGet.Path) {
			t.Errorf("%s path %q needs the admin token (open paths %v)", name, p.HTTPGet.Path, observe.OpenPaths)
		}
		if code := get(p.HTTPGet.Path); code != http.StatusOK {
			t.Errorf("%s path %q: Sluice's admin handler answers %d", name, p.HTTPGet.Path, code)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
		if c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("readiness on %q; want /readyz", c.ReadinessProbe.HTTPGet.Path)
		}
		draining = true
		if code := get(c.ReadinessProbe.HTTPGet.Path); code != http.StatusServiceUnavailable {
			t.Errorf("readiness path answers %d while draining; want 503", code)
		}
		// The kubelet must see the failure within drain_delay.
		notice := time.Duration(c.ReadinessProbe.PeriodSeconds*max(c.ReadinessProbe.FailureThreshold, 1)) * time.Second
		if notice >= cfg.Node.DrainDelay {
			t.Errorf("readiness notices a drain after %v; node.drain_delay is %v", notice, cfg.Node.DrainDelay)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness on %q; want /healthz", c.LivenessProbe.HTTPGet.Path)
	}

	// Drain: preStop, then drain_delay and drain_timeout fit in the grace
	// period with 5s to spare.
	if c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatal("Deployment: no preStop sleep")
	}
	need := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second + cfg.Node.DrainDelay + cfg.Node.DrainTimeout + 5*time.Second
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace < need {
		t.Errorf("terminationGracePeriodSeconds %v < preStop + drain_delay + drain_timeout + 5s = %v", grace, need)
	}
	if cfg.Node.DrainDelay == 0 {
		t.Error("the ConfigMap's config has no node.drain_delay: /readyz would fail only as the listeners close")
	}
}

// loadConfigMap loads the ConfigMap's config as `sluice check` does, with
// the files it names (all under /etc/sluice/, each under a volume the
// Deployment mounts) written into a temporary root.
func loadConfigMap(t *testing.T, text string, mounts map[string]string) *configs.Config {
	t.Helper()
	root := t.TempDir()
	files := regexp.MustCompile(`/etc/sluice/[^\s"']+`).FindAllString(text, -1)
	if len(files) == 0 {
		t.Fatal("the ConfigMap's config names no files under /etc/sluice/")
	}
	for _, f := range files {
		mounted := false
		for _, m := range mounts {
			mounted = mounted || strings.HasPrefix(f, m+"/")
		}
		if !mounted {
			t.Errorf("the config names %s, which no volume mount holds (mounts %v)", f, mounts)
		}
		p := filepath.Join(root, strings.TrimPrefix(f, "/etc/sluice/"))
		os.MkdirAll(filepath.Dir(p), 0o700)
		os.WriteFile(p, []byte("placeholder-secret\n"), 0o600)
	}
	// The TLS pair must be real: the validator loads it.
	writePair(t, filepath.Join(root, "tls"))
	path := filepath.Join(root, "config", "sluice.yaml")
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, "/etc/sluice/", root+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(path)
	if err != nil {
		t.Fatalf("the ConfigMap's config does not load:\n%v", err)
	}
	if cfg.Pools[0].APIKey != "placeholder-secret" {
		t.Errorf("the pool's key was not read from its file: %q", cfg.Pools[0].APIKey)
	}
	if cfg.AdminExposed() {
		t.Error("the admin listener is exposed without admin.token_file")
	}
	return cfg
}

// writePair writes a self-signed tls.crt and tls.key (as a Secret of
// type kubernetes.io/tls is mounted) into dir.
func writePair(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "api.example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"api.example.com"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
}

// The Dockerfile and .ci/run build through deploy/build.sh, which holds
// the release flags; the systemd unit reloads with SIGHUP and keeps only
// CAP_NET_BIND_SERVICE.
func TestBuildFlagsInOnePlace(t *testing.T) {
	build, err := os.ReadFile("build.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w -X main.version=${VERSION}"`} {
		if !bytes.Contains(build, []byte(want)) {
			t.Errorf("deploy/build.sh lacks %s", want)
		}
	}
	for _, f := range []string{"docker/Dockerfile", "../.ci/run"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte("deploy/build.sh")) {
			t.Errorf("%s does not build with deploy/build.sh", f)
		}
		if bytes.Contains(data, []byte("go build -")) || bytes.Contains(data, []byte("-ldflags")) {
			t.Errorf("%s has build flags of its own; they belong in deploy/build.sh", f)
		}
	}
	unit, err := os.ReadFile("systemd/sluice.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecReload=/bin/kill -HUP $MAINPID", "NoNewPrivileges=yes", "ProtectSystem=strict",
		"ProtectHome=yes", "PrivateTmp=yes", "CapabilityBoundingSet=CAP_NET_BIND_SERVICE\n",
		"AmbientCapabilities=CAP_NET_BIND_SERVICE\n", "LimitNOFILE=", "User=sluice", "Environment=SLUICE_CONFIG="} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("systemd/sluice.service lacks %q", want)
		}
	}
}
