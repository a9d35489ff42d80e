package deploy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/status"
)

const (
	binPath     = "/usr/local/bin/outboxd"
	metricsPort = "8080"
	testDSN     = "postgres://outboxd:s3cret-pw@db.example:5432/app?sslmode=disable"
	// exitUsage is outboxd's exit status for a wrong command line
	// (cmd/outboxd exitCode, as Go's flag package).
	exitUsage = 2
)

// loadConfig loads and validates a configuration file the way outboxd does,
// with the DSN from the environment as every deployment passes it.
func loadConfig(t *testing.T, path string) config.Config {
	t.Helper()
	cfg, err := config.Load(path, []string{"OUTBOXD_POSTGRES_DSN=" + testDSN})
	if err != nil {
		t.Fatalf("config.Load(%s): %v", path, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if _, port, _ := net.SplitHostPort(cfg.HTTP.Listen); port != metricsPort {
		t.Errorf("%s: http.listen %q, want port %s (the port the manifests expose)", path, cfg.HTTP.Listen, metricsPort)
	}
	return cfg
}

func TestExampleConfig(t *testing.T) {
	cfg := loadConfig(t, "outboxd.yaml")
	if cfg.Log.Format != "json" {
		t.Errorf("log.format %q: deployments ship logs as json", cfg.Log.Format)
	}
	// The file itself must not carry a password.
	data, _ := os.ReadFile("outboxd.yaml")
	if regexp.MustCompile(`postgres://[^:@/\s]+:[^@\s]+@`).Match(data) {
		t.Error("outboxd.yaml contains a DSN with a password; secrets come from OUTBOXD_POSTGRES_DSN")
	}
}

// --- Dockerfile -------------------------------------------------------------

// readDockerfile returns the Dockerfile's instructions, continuation lines
// joined and comments dropped, and those of its final stage.
func readDockerfile(t *testing.T) (lines, final []string) {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines, drop comments.
	var cur strings.Builder
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if s, ok := strings.CutSuffix(strings.TrimRight(l, " \t"), `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		if s := strings.TrimSpace(cur.String()); s != "" {
			lines = append(lines, s)
		}
		cur.Reset()
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			final = nil
		}
		final = append(final, l)
	}
	return lines, final
}

// instruction returns the arguments of the last instruction name in lines.
func instruction(lines []string, name string) string {
	for _, l := range slices.Backward(lines) {
		if rest, ok := strings.CutPrefix(l, name+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// execForm decodes an exec-form (JSON array) instruction argument.
func execForm(t *testing.T, what, s string) []string {
	t.Helper()
	var args []string
	if err := json.Unmarshal([]byte(s), &args); err != nil {
		t.Fatalf("%s %s: not an exec-form JSON array: %v", what, s, err)
	}
	return args
}

// configFlag returns the value of -config in args, or "".
func configFlag(args []string) string {
	for i, a := range args {
		if (a == "-config" || a == "--config") && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "config="); ok && strings.HasPrefix(a, "-") {
			return v
		}
	}
	return ""
}

func TestDockerfile(t *testing.T) {
	lines, final := readDockerfile(t)
	var froms []string
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			froms = append(froms, l)
		}
	}
	all := strings.Join(lines, "\n")
	if len(froms) < 2 {
		t.Errorf("want a multi-stage build, got %d FROM", len(froms))
	}
	want := map[string]bool{
		"final stage is distroless static, nonroot": strings.HasPrefix(final[0], "FROM gcr.io/distroless/static") && strings.Contains(final[0], "nonroot"),
		"static build (CGO_ENABLED=0)":              strings.Contains(all, "CGO_ENABLED=0"),
		"version stamped (-X main.version=)":        strings.Contains(all, "-X main.version=${VERSION}"),
		"commit stamped (-X main.commit=)":          strings.Contains(all, "-X main.commit=${COMMIT}"),
		"ARG VERSION and ARG COMMIT":                strings.Contains(all, "ARG VERSION") && strings.Contains(all, "ARG COMMIT"),
		"builds ./cmd/outboxd":                      strings.Contains(all, "./cmd/outboxd"),
	}
	for what, ok := range want {
		if !ok {
			t.Errorf("Dockerfile: %s", what)
		}
	}
	instr := func(name string) string {
		for _, l := range final {
			if rest, ok := strings.CutPrefix(l, name+" "); ok {
				return strings.TrimSpace(rest)
			}
		}
		return ""
	}
	if u := instr("USER"); u == "" || strings.HasPrefix(u, "root") || strings.HasPrefix(u, "0") {
		t.Errorf("final stage USER %q: must be non-root", u)
	}
	if e := instr("EXPOSE"); e != metricsPort {
		t.Errorf("EXPOSE %q, want %s", e, metricsPort)
	}
	if e := instr("ENTRYPOINT"); e != `["`+binPath+`"]` {
		t.Errorf("ENTRYPOINT %s, want [%q]", e, binPath)
	}
	if c := instr("COPY"); !strings.HasSuffix(c, " "+binPath) {
		t.Errorf("final COPY %q does not install %s", c, binPath)
	}
	hc := instr("HEALTHCHECK")
	if !strings.Contains(hc, `CMD ["`+binPath+`", "healthcheck"`) {
		t.Errorf("HEALTHCHECK %q, want exec form running %s healthcheck", hc, binPath)
	}
}

// TestHealthcheckReadsTheRunConfig: `outboxd healthcheck` finds the address
// to probe in http.listen of its -config file, so the Docker HEALTHCHECK and
// compose's healthcheck must name the file the process itself runs with;
// without it they probe the default :8080 and a configuration listening
// elsewhere is reported unhealthy.
func TestHealthcheckReadsTheRunConfig(t *testing.T) {
	_, final := readDockerfile(t)
	run := append(execForm(t, "ENTRYPOINT", instruction(final, "ENTRYPOINT")), execForm(t, "CMD", instruction(final, "CMD"))...)
	_, hcArgs, ok := strings.Cut(instruction(final, "HEALTHCHECK"), " CMD ")
	if !ok {
		t.Fatalf("HEALTHCHECK %q has no CMD", instruction(final, "HEALTHCHECK"))
	}
	hc := execForm(t, "HEALTHCHECK CMD", hcArgs)
	runCfg, hcCfg := configFlag(run), configFlag(hc)
	if runCfg == "" {
		t.Errorf("ENTRYPOINT+CMD %v passes no -config", run)
	}
	if hcCfg != runCfg {
		t.Errorf("HEALTHCHECK %v reads -config %q, the process (ENTRYPOINT+CMD %v) reads %q", hc, hcCfg, run, runCfg)
	}
	// The default CMD must work without a mount: the image carries the file.
	if !slices.ContainsFunc(final, func(l string) bool {
		return strings.HasPrefix(l, "COPY ") && strings.HasSuffix(l, " "+runCfg)
	}) {
		t.Errorf("the final stage does not install %s, which the default CMD reads", runCfg)
	}

	c := readCompose(t)
	for name, s := range c.Services {
		if s.Healthcheck == nil || !slices.Contains(s.Healthcheck.Test, "healthcheck") {
			continue
		}
		if got, want := configFlag(s.Healthcheck.Test), configFlag(s.Command); got != want || want == "" {
			t.Errorf("compose service %s: healthcheck %v reads -config %q, its command %v reads %q", name, s.Healthcheck.Test, got, s.Command, want)
		}
	}
}

// --- compose ----------------------------------------------------------------

type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string `yaml:"image"`
	Build       *struct{ Context, Dockerfile string }
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	User     string `yaml:"user"`
	ReadOnly bool   `yaml:"read_only"`
	Restart  string `yaml:"restart"`
}

func TestCompose(t *testing.T) {
	c := readCompose(t)
	for _, name := range []string{"postgres", "kafka", "migrate", "outboxd"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("compose.yaml has no service %s", name)
		}
	}
	pg, kafka, od := c.Services["postgres"], c.Services["kafka"], c.Services["outboxd"]
	if !slices.Contains(pg.Command, "wal_level=logical") {
		t.Errorf("postgres command %v does not set wal_level=logical", pg.Command)
	}
	if !strings.HasPrefix(kafka.Image, "apache/kafka:") {
		t.Errorf("kafka image %q, want apache/kafka", kafka.Image)
	}
	if !strings.Contains(kafka.Environment["KAFKA_PROCESS_ROLES"], "controller") {
		t.Error("kafka is not in KRaft mode (KAFKA_PROCESS_ROLES without controller)")
	}
	for _, name := range []string{"migrate", "outboxd"} {
		s := c.Services[name]
		if s.Build == nil || filepath.Join(s.Build.Context, s.Build.Dockerfile) != "../Dockerfile" {
			t.Errorf("%s is not built from the repository's Dockerfile: %+v", name, s.Build)
		}
		// The -config file is the mounted example configuration.
		i := slices.Index(s.Command, "-config")
		if i < 0 || i+1 >= len(s.Command) || !slices.Contains(s.Volumes, "./outboxd.yaml:"+s.Command[i+1]+":ro") {
			t.Errorf("%s: command %v does not read the mounted ./outboxd.yaml (volumes %v)", name, s.Command, s.Volumes)
		}
		if s.Environment["OUTBOXD_POSTGRES_DSN"] == "" {
			t.Errorf("%s: no OUTBOXD_POSTGRES_DSN", name)
		}
	}
	if !slices.Contains(od.Ports, metricsPort+":"+metricsPort) {
		t.Errorf("outboxd ports %v do not publish %s", od.Ports, metricsPort)
	}
	if od.Healthcheck == nil || !slices.Equal(od.Healthcheck.Test[:min(3, len(od.Healthcheck.Test))], []string{"CMD", binPath, "healthcheck"}) {
		t.Errorf("outboxd healthcheck %+v, want [CMD %s healthcheck ...]", od.Healthcheck, binPath)
	}
	for dep, want := range map[string]string{"postgres": "service_healthy", "kafka": "service_healthy", "migrate": "service_completed_successfully"} {
		if got := od.DependsOn[dep].Condition; got != want {
			t.Errorf("outboxd depends_on %s: condition %q, want %q", dep, got, want)
		}
	}
	for name, s := range c.Services {
		if name != "migrate" && s.Healthcheck == nil {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	if od.User == "" || strings.HasPrefix(od.User, "0") || !od.ReadOnly || od.Restart != "on-failure" {
		t.Errorf("outboxd: user %q, read_only %v, restart %q: want non-root, read-only, on-failure", od.User, od.ReadOnly, od.Restart)
	}
	// The example configuration reaches these services by their compose names.
	cfg := loadConfig(t, "outboxd.yaml")
	for _, b := range cfg.Kafka.Brokers {
		if !strings.Contains(kafka.Environment["KAFKA_ADVERTISED_LISTENERS"], "//"+b) {
			t.Errorf("kafka.brokers %s is not an advertised listener (%s)", b, kafka.Environment["KAFKA_ADVERTISED_LISTENERS"])
		}
	}
	if !strings.Contains(od.Environment["OUTBOXD_POSTGRES_DSN"], "@postgres:5432/"+pg.Environment["POSTGRES_DB"]) {
		t.Errorf("outboxd's DSN does not point at the postgres service's database")
	}
}

// --- Kubernetes ---------------------------------------------------------------

type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`
	file string
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

type deploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Strategy struct {
		Type          string `yaml:"type"`
		RollingUpdate struct {
			MaxSurge       any `yaml:"maxSurge"`
			MaxUnavailable any `yaml:"maxUnavailable"`
		} `yaml:"rollingUpdate"`
	} `yaml:"strategy"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			AutomountServiceAccountToken  *bool `yaml:"automountServiceAccountToken"`
			TerminationGracePeriodSeconds int   `yaml:"terminationGracePeriodSeconds"`
			SecurityContext               struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
				RunAsUser    int  `yaml:"runAsUser"`
			} `yaml:"securityContext"`
			Containers []struct {
				Name  string   `yaml:"name"`
				Image string   `yaml:"image"`
				Args  []string `yaml:"args"`
				Env   []struct {
					Name      string `yaml:"name"`
					Value     string `yaml:"value"`
					ValueFrom *struct {
						SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
					} `yaml:"valueFrom"`
				} `yaml:"env"`
				Ports []struct {
					Name          string `yaml:"name"`
					ContainerPort int    `yaml:"containerPort"`
				} `yaml:"ports"`
				StartupProbe   *probe `yaml:"startupProbe"`
				LivenessProbe  *probe `yaml:"livenessProbe"`
				ReadinessProbe *probe `yaml:"readinessProbe"`
				Resources      struct {
					Requests map[string]string `yaml:"requests"`
					Limits   map[string]string `yaml:"limits"`
				} `yaml:"resources"`
				SecurityContext struct {
					AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
					ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
					Capabilities             struct {
						Drop []string `yaml:"drop"`
					} `yaml:"capabilities"`
				} `yaml:"securityContext"`
				VolumeMounts []struct {
					Name      string `yaml:"name"`
					MountPath string `yaml:"mountPath"`
					ReadOnly  bool   `yaml:"readOnly"`
				} `yaml:"volumeMounts"`
			} `yaml:"containers"`
			Volumes []struct {
				Name      string `yaml:"name"`
				ConfigMap *struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

// loadKustomization returns every object of the resources
// kustomization.yaml lists (multi-document YAML), and its images.
func loadKustomization(t *testing.T) ([]k8sObject, map[string]string) {
	t.Helper()
	var k struct {
		APIVersion string   `yaml:"apiVersion"`
		Kind       string   `yaml:"kind"`
		Resources  []string `yaml:"resources"`
		Images     []struct {
			Name   string `yaml:"name"`
			NewTag string `yaml:"newTag"`
		} `yaml:"images"`
	}
	readYAML(t, "kubernetes/kustomization.yaml", &k)
	files, _ := filepath.Glob("kubernetes/*.yaml")
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(k.Resources, b) {
			t.Errorf("%s is not listed in kustomization.yaml", f)
		}
	}
	var objs []k8sObject
	for _, r := range k.Resources {
		f, err := os.Open(filepath.Join("kubernetes", r))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("kubernetes/%s: %v", r, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("kubernetes/%s: an object without apiVersion, kind or name", r)
			}
			o.file = r
			objs = append(objs, o)
		}
		f.Close()
	}
	images := map[string]string{}
	for _, im := range k.Images {
		images[im.Name] = im.NewTag
	}
	return objs, images
}

func find(t *testing.T, objs []k8sObject, kind string, spec any) k8sObject {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind {
			if spec != nil {
				if err := o.Spec.Decode(spec); err != nil {
					t.Fatalf("%s %s: %v", kind, o.Metadata.Name, err)
				}
			}
			return o
		}
	}
	t.Fatalf("no %s in deploy/kubernetes", kind)
	return k8sObject{}
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetes(t *testing.T) {
	objs, images := loadKustomization(t)

	cm := find(t, objs, "ConfigMap", nil)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(cfgPath, []byte(cm.Data["outboxd.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, cfgPath)
	if strings.Contains(cm.Data["outboxd.yaml"], "dsn:") {
		t.Error("the ConfigMap sets postgres.dsn; the DSN belongs in the Secret")
	}

	var d deploymentSpec
	dep := find(t, objs, "Deployment", &d)
	pod := d.Template.Spec
	if d.Replicas != 2 {
		t.Errorf("replicas %d, want 2 (one streams, one standby)", d.Replicas)
	}
	if !subset(d.Selector.MatchLabels, d.Template.Metadata.Labels) {
		t.Error("the Deployment's selector does not match its pod labels")
	}
	if ru := d.Strategy.RollingUpdate; d.Strategy.Type != "RollingUpdate" || ru.MaxUnavailable != 0 {
		t.Errorf("strategy %+v: want RollingUpdate with maxUnavailable 0 (a standby joins before an old pod stops)", d.Strategy)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	repo, tag, _ := strings.Cut(c.Image, ":")
	if repo != "ghcr.io/outboxd/outboxd" || images[repo] == "" || tag == "" {
		t.Errorf("image %q: want ghcr.io/outboxd/outboxd:<tag>, with kustomization images setting its tag", c.Image)
	}
	var portName string
	for _, p := range c.Ports {
		if p.ContainerPort == 8080 {
			portName = p.Name
		}
	}
	if portName != "metrics" {
		t.Errorf("container ports %+v: want 8080 named metrics", c.Ports)
	}
	for what, p := range map[string]struct {
		probe *probe
		path  string
	}{
		"startupProbe":  {c.StartupProbe, "/healthz"},
		"livenessProbe": {c.LivenessProbe, "/healthz"},
		// /healthz, not /readyz: see the comment in deployment.yaml.
		"readinessProbe": {c.ReadinessProbe, "/healthz"},
	} {
		if p.probe == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != portName {
			t.Errorf("%s %+v: want GET %s on port %s", what, p.probe, p.path, portName)
		}
	}
	if sp := c.StartupProbe; sp != nil && sp.PeriodSeconds*sp.FailureThreshold < 30 {
		t.Errorf("startupProbe allows %ds; the start-up checks (Postgres, slot, Kafka ping) may take 20s", sp.PeriodSeconds*sp.FailureThreshold)
	}
	i := slices.Index(c.Args, "-config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("args %v: no -config", c.Args)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name &&
				c.Args[i+1] == filepath.Join(m.MountPath, "outboxd.yaml") && m.ReadOnly {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("-config %s is not the ConfigMap %s mounted read-only", c.Args[i+1], cm.Metadata.Name)
	}
	dsnFromSecret := false
	for _, e := range c.Env {
		if e.Name == "OUTBOXD_POSTGRES_DSN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.Value == "" {
			dsnFromSecret = true
		}
	}
	if !dsnFromSecret {
		t.Error("OUTBOXD_POSTGRES_DSN must come from a Secret (valueFrom.secretKeyRef)")
	}
	sc := c.SecurityContext
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == 0 || !sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("security: pod %+v, container %+v: want non-root, read-only root, no privilege escalation, all capabilities dropped", pod.SecurityContext, sc)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken must be false: outboxd does not talk to the API server")
	}
	if c.Resources.Requests["memory"] != "64Mi" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want a 64Mi memory request and a memory limit", c.Resources)
	}
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= cfg.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %s must exceed shutdown_timeout %s", grace, cfg.ShutdownTimeout)
	}

	var svc struct {
		Selector                 map[string]string `yaml:"selector"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Ports                    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	}
	s := find(t, objs, "Service", &svc)
	if !subset(svc.Selector, d.Template.Metadata.Labels) {
		t.Error("the Service does not select the Deployment's pods")
	}
	if len(svc.Ports) != 1 || svc.Ports[0].Name != "metrics" || svc.Ports[0].Port != 8080 || svc.Ports[0].TargetPort != portName {
		t.Errorf("Service ports %+v: want metrics 8080 -> %s", svc.Ports, portName)
	}

	var pdb struct {
		MaxUnavailable             any    `yaml:"maxUnavailable"`
		MinAvailable               any    `yaml:"minAvailable"`
		UnhealthyPodEvictionPolicy string `yaml:"unhealthyPodEvictionPolicy"`
		Selector                   struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
	}
	find(t, objs, "PodDisruptionBudget", &pdb)
	if !subset(pdb.Selector.MatchLabels, d.Template.Metadata.Labels) || pdb.MaxUnavailable != 1 || pdb.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget %+v: want maxUnavailable 1 over the Deployment's pods", pdb)
	}

	var sm struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
	}
	find(t, objs, "ServiceMonitor", &sm)
	if !subset(sm.Selector.MatchLabels, s.Metadata.Labels) {
		t.Error("the ServiceMonitor does not select the Service")
	}
	if len(sm.Endpoints) != 1 || sm.Endpoints[0].Port != "metrics" || sm.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v: want port metrics, path /metrics", sm.Endpoints)
	}
	// The job label is the Service's name; the alert rules select it.
	if !regexp.MustCompile(`.*outboxd.*`).MatchString(s.Metadata.Name) {
		t.Errorf("Service %s: the rules' up{job=~\".*outboxd.*\"} would not match its job", s.Metadata.Name)
	}
	find(t, objs, "PrometheusRule", nil)
	_ = dep
}

// --- systemd -------------------------------------------------------------------

// readUnit parses a systemd unit: section -> key -> values (in order).
func readUnit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unit := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not key=value in a section: %q", path, n, line)
			}
			unit[section][k] = append(unit[section][k], v)
		}
	}
	return unit
}

func TestSystemdUnit(t *testing.T) {
	u := readUnit(t, "systemd/outboxd.service")
	svc := u["Service"]
	want := map[string]string{
		"Restart":                 "on-failure",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"PrivateTmp":              "yes",
		"CapabilityBoundingSet":   "",
		"DynamicUser":             "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"EnvironmentFile":         "/etc/outboxd/outboxd.env",
		"KillSignal":              "SIGTERM",
	}
	for k, v := range want {
		if got, ok := svc[k]; !ok || got[len(got)-1] != v {
			t.Errorf("[Service] %s=%q, want %q", k, got, v)
		}
	}
	// A restart after a lost slot would create a new one past what the old
	// one had not confirmed.
	// A wrong command line (exit 2, as Go's flag package) fails the same
	// way at every restart.
	var prevent []string
	for _, v := range svc["RestartPreventExitStatus"] {
		prevent = append(prevent, strings.Fields(v)...)
	}
	for _, code := range []int{status.ExitSlotGone, exitUsage} {
		if !slices.Contains(prevent, strconv.Itoa(code)) {
			t.Errorf("[Service] RestartPreventExitStatus=%v, want %d among them (status.ExitSlotGone 3, a wrong command line 2)", prevent, code)
		}
	}
	exec := strings.Fields(svc["ExecStart"][0])
	if exec[0] != binPath || !slices.Contains(exec, "-config") {
		t.Errorf("ExecStart %v: want %s -config FILE", exec, binPath)
	}
	stop, err := time.ParseDuration(svc["TimeoutStopSec"][0])
	if err != nil || stop <= config.Default().ShutdownTimeout {
		t.Errorf("TimeoutStopSec %v must exceed the default shutdown_timeout %s", svc["TimeoutStopSec"], config.Default().ShutdownTimeout)
	}
	// A dependency that is down for a while at boot makes outboxd exit 1 at
	// every start: the start limit must never be reached by restarting at
	// RestartSec, or the unit stays failed after the dependency is back.
	restart, err := time.ParseDuration(svc["RestartSec"][0])
	if err != nil {
		t.Fatalf("RestartSec %v: %v", svc["RestartSec"], err)
	}
	limitInterval, burst := 10*time.Second, 5 // systemd's defaults
	if v := u["Unit"]["StartLimitIntervalSec"]; len(v) > 0 {
		if limitInterval, err = parseSystemdSeconds(v[len(v)-1]); err != nil {
			t.Fatalf("StartLimitIntervalSec %v: %v", v, err)
		}
	}
	if v := u["Unit"]["StartLimitBurst"]; len(v) > 0 {
		if burst, err = strconv.Atoi(v[len(v)-1]); err != nil {
			t.Fatalf("StartLimitBurst %v: %v", v, err)
		}
	}
	if limitInterval != 0 && time.Duration(burst)*restart <= limitInterval {
		t.Errorf("StartLimitBurst=%d in StartLimitIntervalSec=%s with RestartSec=%s: restarting through an outage longer than %s leaves the unit failed; set StartLimitIntervalSec=0",
			burst, limitInterval, restart, time.Duration(burst)*restart)
	}
	if got := u["Install"]["WantedBy"]; !slices.Equal(got, []string{"multi-user.target"}) {
		t.Errorf("[Install] WantedBy=%v", got)
	}
	if !slices.Contains(u["Unit"]["After"], "network-online.target") {
		t.Error("[Unit] After= lacks network-online.target")
	}
}

// parseSystemdSeconds parses a systemd time span as the unit uses them: a
// bare number of seconds, or a Go duration ("10min" is written "10m").
func parseSystemdSeconds(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(strings.Replace(v, "min", "m", 1))
}

// --- scripts/release and the binary ------------------------------------------

// release builds the host's binary with scripts/release into a temporary
// directory and returns its path.
func release(t *testing.T, version, commit string) string {
	t.Helper()
	dist := t.TempDir()
	target := runtime.GOOS + "/" + runtime.GOARCH
	cmd := exec.Command("../scripts/release")
	cmd.Env = append(os.Environ(), "VERSION="+version, "COMMIT="+commit, "DIST="+dist, "RELEASE_TARGETS="+target)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release: %v\n%s", err, out)
	}
	name := "outboxd-" + version + "-" + runtime.GOOS + "-" + runtime.GOARCH
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(filepath.Join(dist, name))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	if want := hex.EncodeToString(sum[:]) + "  " + name + "\n"; string(sums) != want {
		t.Errorf("SHA256SUMS = %q, want %q", sums, want)
	}
	return filepath.Join(dist, name)
}

// outboxdEnv is the environment without OUTBOXD_* settings (an unknown one
// is an error), plus the test DSN.
func outboxdEnv() []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OUTBOXD_") })
	return append(env, "OUTBOXD_POSTGRES_DSN="+testDSN)
}

func TestReleaseBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds outboxd; skipped with -short")
	}
	const version, commit = "v0.0.0-deploytest", "0123456789abcdef0123456789abcdef01234567"
	bin := release(t, version, commit)

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the release binary is dynamically linked (has PT_INTERP); build with CGO_ENABLED=0")
		}
	}
	f.Close()

	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("outboxd version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), version) {
		t.Errorf("outboxd version printed %q, want the stamped version %s", out, version)
	}
	// main.commit is stamped with -X; check it once main declares it.
	if src, _ := os.ReadFile("../cmd/outboxd/main.go"); regexp.MustCompile(`(?m)^\s*(var\s+)?commit\s+=`).Match(src) &&
		!strings.Contains(string(out), commit[:7]) {
		t.Errorf("outboxd version printed %q, want the stamped commit %s", out, commit)
	}

	for _, cfg := range []string{"outboxd.yaml"} {
		cmd := exec.Command(bin, "-config", cfg, "-check-config")
		cmd.Env = outboxdEnv()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("outboxd -config %s -check-config: %v\n%s%s", cfg, err, stdout.String(), stderr.String())
		}
		if !strings.Contains(stdout.String(), "configuration is valid") {
			t.Errorf("-check-config printed %q", stdout.String())
		}
		if strings.Contains(stdout.String()+stderr.String(), "s3cret-pw") {
			t.Error("-check-config printed the DSN's password")
		}
	}

	// A wrong command line exits 2 (exitUsage), which the systemd unit
	// does not restart on.
	cmd := exec.Command(bin, "-no-such-flag")
	cmd.Env = outboxdEnv()
	var ee *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Errorf("outboxd -no-such-flag: %v, want exit status %d", err, exitUsage)
	}

	// A bad configuration exits 1.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("kafka:\n  no_such_key: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(bin, "-config", bad, "-check-config")
	cmd.Env = outboxdEnv()
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("-check-config of an unknown key: %v, want exit status 1", err)
	}

	// The Docker HEALTHCHECK's contract: `outboxd healthcheck` exits 0 when
	// /healthz answers 200 and 1 otherwise (checked once main has it).
	if src, _ := os.ReadFile("../cmd/outboxd/main.go"); bytes.Contains(src, []byte(`"healthcheck"`)) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/healthz" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"status":"ok"}`)
		}))
		for _, tc := range []struct {
			url  string
			exit int
		}{{srv.URL, 0}, {srv.URL + "/nowhere", 1}} {
			cmd := exec.Command(bin, "healthcheck", "-url", tc.url)
			cmd.Env = outboxdEnv()
			out, err := cmd.CombinedOutput()
			code := 0
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatalf("outboxd healthcheck: %v", err)
			}
			if code != tc.exit {
				t.Errorf("outboxd healthcheck -url %s: exit %d, want %d\n%s", tc.url, code, tc.exit, out)
			}
		}
		srv.Close()
	} else {
		t.Log("cmd/outboxd has no healthcheck subcommand yet; the Docker HEALTHCHECK needs it")
	}

	// The unit file is valid for systemd (keys and values), with ExecStart
	// pointing at the binary just built.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed; the unit was checked by parsing only")
		return
	}
	unit, _ := os.ReadFile("systemd/outboxd.service")
	dir := t.TempDir()
	path := filepath.Join(dir, "outboxd.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(unit, []byte(binPath), []byte(bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	vout, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(vout)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, vout)
	}
}

// readCompose reads compose.yaml.
func readCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return c
}

// TestDockerignoreKeepsTheBuild: the image builds ./cmd/outboxd from the
// build context, so .dockerignore may leave out anything but the module files
// and the packages the binary is built from.
func TestDockerignoreKeepsTheBuild(t *testing.T) {
	raw, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf("reading .dockerignore: %v", err)
	}
	var patterns []string
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		patterns = append(patterns, strings.TrimSuffix(line, "/"))
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "../cmd/outboxd").Output()
	if err != nil {
		t.Fatalf("go list -deps ../cmd/outboxd: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, dir := range strings.Fields(string(out)) {
		if rel, err := filepath.Rel(root, dir); err == nil && !strings.HasPrefix(rel, "..") {
			needed = append(needed, filepath.ToSlash(rel))
		}
	}
	for _, path := range needed {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, path); ok || strings.HasPrefix(path+"/", p+"/") {
				t.Errorf(".dockerignore pattern %q leaves out %s, which the image's build needs", p, path)
			}
		}
	}
}
