package main

// The deployment files under deploy/ (docs/deploy.md) checked against the
// binary they run: the Kubernetes manifests' probes, ports, flags and
// Secret-fed variables against a real `outbox relay` started as they say,
// the Dockerfile's HEALTHCHECK run against that relay, and the systemd
// unit's command line and environment file against `outbox relay --help`
// (and systemd-analyze verify, where the machine has it).

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v2"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

var deployDir = filepath.Join("..", "..", "deploy")

// k8sObject is what the test reads of a Kubernetes object.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		Replicas int `yaml:"replicas"`
		// Selector is a label map on a Service, {matchLabels: ...} on the
		// others.
		Selector     map[string]any `yaml:"selector"`
		MinAvailable any            `yaml:"minAvailable"`
		Template     struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
		RunAsUser    int  `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []k8sContainer `yaml:"containers"`
}

type k8sContainer struct {
	Name  string   `yaml:"name"`
	Args  []string `yaml:"args"`
	Env   []k8sEnv `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Resources      struct {
		Limits map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type k8sEnv struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		ResourceFieldRef *struct {
			Resource string `yaml:"resource"`
		} `yaml:"resourceFieldRef"`
	} `yaml:"valueFrom"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// readManifests reads every document of the YAML files under
// deploy/kubernetes: each must parse (duplicate keys refused) and name its
// apiVersion, kind and name.
func readManifests(t *testing.T) map[string]k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under deploy/kubernetes: %v", err)
	}
	objs := map[string]k8sObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		strict := yaml.NewDecoder(bytes.NewReader(b))
		strict.SetStrict(true)
		for {
			var m map[string]any
			if err := strict.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: a document without apiVersion, kind or metadata.name: %+v", f, o)
			}
			key := o.Kind + "/" + o.Metadata.Name
			if _, dup := objs[key]; dup {
				t.Fatalf("%s: %s twice", f, key)
			}
			objs[key] = o
		}
	}
	return objs
}

// matchLabels is a Deployment's, PDB's or ServiceMonitor's selector.
func matchLabels(t *testing.T, o k8sObject) map[string]string {
	t.Helper()
	ml, ok := o.Spec.Selector["matchLabels"].(map[any]any)
	if !ok || len(ml) == 0 {
		t.Fatalf("%s/%s: no spec.selector.matchLabels", o.Kind, o.Metadata.Name)
	}
	return stringMap(ml)
}

func stringMap(m map[any]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k.(string)] = v.(string)
	}
	return out
}

// selects reports whether the labels hold every pair of the selector.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// commandHelp returns what `outbox <command> --help` prints: its flag
// names and the environment variables it names ("(env X)").
func commandHelp(t *testing.T, command string) (flags, env map[string]bool) {
	t.Helper()
	stdout, stderr, code := runOutbox(t, nil, command, "--help")
	if code != 0 {
		t.Fatalf("outbox %s --help: exit %d: %s", command, code, stderr)
	}
	help := stdout + stderr
	flags, env = map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`\benv ([A-Z][A-Z0-9_]+)`).FindAllStringSubmatch(help, -1) {
		env[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("outbox %s --help: no flags found in:\n%s", command, help)
	}
	return flags, env
}

// flagArgs checks that args are flags of `outbox <command>` (in --help),
// and that they parse: `outbox <command> <args> --help` exits 0 only when
// every flag before --help and its value were accepted.
func flagArgs(t *testing.T, where, command string, args []string) {
	t.Helper()
	flags, _ := commandHelp(t, command)
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !flags[name] {
			t.Errorf("%s: %s is not a flag of outbox %s (--help)", where, a, command)
		}
	}
	if _, stderr, code := runOutbox(t, nil, append(append([]string{command}, args...), "--help")...); code != 0 {
		t.Errorf("%s: outbox %s %s does not parse: exit %d: %s", where, command, strings.Join(args, " "), code, stderr)
	}
}

// flagValue is the value of --name in args (--name=v or --name v).
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		a = "--" + strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// portOf is the port of a host:port address.
func portOf(t *testing.T, where, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("%s: %q is not host:port", where, addr)
	}
	return n
}

// memoryBytes reads a Kubernetes memory quantity in Mi or Gi.
func memoryBytes(t *testing.T, q string) int64 {
	t.Helper()
	for suffix, unit := range map[string]int64{"Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err == nil {
				return v * unit
			}
		}
	}
	t.Fatalf("memory quantity %q: the test reads Mi and Gi", q)
	return 0
}

// TestKubernetesManifestsMatchTheRelay: the Deployment runs `outbox relay`
// with flags it has, serves its metrics on the port it names "metrics"
// (the --metrics-addr port), probes /readyz and /healthz there, takes the
// database URL and destination from a Secret under the names the relay
// reads, and runs as a non-root user on a read-only root; the Service,
// PodDisruptionBudget and ServiceMonitor select its pods and port. Then
// the relay is started with the Deployment's arguments and environment
// (the Secret's values and the pod's fields filled in by the test): the
// probes' paths answer 200 (readiness once it relays), the
// ServiceMonitor's path serves outbox_ metrics, and the Dockerfile's
// HEALTHCHECK command, run against it, succeeds.
func TestKubernetesManifestsMatchTheRelay(t *testing.T) {
	t.Parallel()
	objs := readManifests(t)
	dep, ok := objs["Deployment/outbox-relay"]
	if !ok {
		t.Fatalf("no Deployment outbox-relay under deploy/kubernetes: %v", slices.Sorted(maps.Keys(objs)))
	}
	pod := dep.Spec.Template.Spec
	podLabels := dep.Spec.Template.Metadata.Labels
	if !selects(matchLabels(t, dep), podLabels) {
		t.Fatalf("the Deployment's selector does not select its pods' labels %v", podLabels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("the Deployment runs %d containers, want the relay", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "relay" {
		t.Fatalf("the container's args %q do not run outbox relay", c.Args)
	}
	flagArgs(t, "relay.yaml", "relay", c.Args[1:])
	metricsAddr, ok := flagValue(c.Args, "metrics-addr")
	if !ok {
		t.Fatalf("the relay's args %q have no --metrics-addr: nothing would serve the probes", c.Args)
	}
	port := portOf(t, "--metrics-addr", metricsAddr)
	named := map[string]int{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	if named["metrics"] != port {
		t.Errorf("container port \"metrics\" is %d, the relay serves on %d", named["metrics"], port)
	}
	resolve := func(where string, p any) int {
		switch v := p.(type) {
		case int:
			return v
		case string:
			if n, ok := named[v]; ok {
				return n
			}
		}
		t.Errorf("%s: port %v is not a container port", where, p)
		return 0
	}
	probes := map[string]*k8sProbe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe}
	for want, p := range probes {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("the relay has no HTTP probe on %s", want)
		}
		if p.HTTPGet.Path != want || resolve("probe "+want, p.HTTPGet.Port) != port {
			t.Errorf("probe %s:%v, want %s on %d", p.HTTPGet.Path, p.HTTPGet.Port, want, port)
		}
	}
	// Secrets from a Secret: the database URL and the destination (which
	// can carry a password) never as a literal value.
	secretEnv := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secretEnv[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	for _, name := range []string{"DATABASE_URL", "OUTBOX_DESTINATION"} {
		if secretEnv[name] == "" {
			t.Errorf("%s is not taken from a Secret (secretKeyRef)", name)
		}
	}
	sc := c.SecurityContext
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == 0 || !sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("the relay's security context is not locked down: pod %+v, container %+v", pod.SecurityContext, sc)
	}
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= outbox.ShutdownTimeoutDefault {
		t.Errorf("terminationGracePeriodSeconds %s is not longer than the relay's --shutdown-timeout %s", grace, outbox.ShutdownTimeoutDefault)
	}

	svc, ok := objs["Service/outbox-relay"]
	if !ok {
		t.Fatal("no Service outbox-relay")
	}
	svcSelector := map[string]string{}
	for k, v := range svc.Spec.Selector {
		svcSelector[k], _ = v.(string)
	}
	if !selects(svcSelector, podLabels) {
		t.Errorf("the Service's selector %v does not select the relay's pods %v", svcSelector, podLabels)
	}
	svcPorts := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		if resolve("Service port "+p.Name, p.TargetPort) == port {
			svcPorts[p.Name] = true
		}
	}
	pdb, ok := objs["PodDisruptionBudget/outbox-relay"]
	if !ok {
		t.Fatal("no PodDisruptionBudget outbox-relay")
	}
	if !selects(matchLabels(t, pdb), podLabels) || pdb.Spec.MinAvailable == nil {
		t.Errorf("the PodDisruptionBudget does not keep the relay's pods: %+v", pdb.Spec)
	}
	if n, ok := pdb.Spec.MinAvailable.(int); ok && n >= dep.Spec.Replicas {
		t.Errorf("PodDisruptionBudget minAvailable %d with %d replicas: a node could never be drained", n, dep.Spec.Replicas)
	}
	sm, ok := objs["ServiceMonitor/outbox-relay"]
	if !ok {
		t.Fatal("no ServiceMonitor outbox-relay")
	}
	if !selects(matchLabels(t, sm), svc.Metadata.Labels) {
		t.Errorf("the ServiceMonitor's selector does not select the Service's labels %v", svc.Metadata.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || !svcPorts[sm.Spec.Endpoints[0].Port] || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("the ServiceMonitor's endpoints %+v, want /metrics on a Service port of the relay's metrics (%v)", sm.Spec.Endpoints, svcPorts)
	}
	if job, ok := objs["Job/outbox-migrate"]; ok {
		jc := job.Spec.Template.Spec.Containers
		if len(jc) != 1 || len(jc[0].Args) == 0 || jc[0].Args[0] != "migrate" {
			t.Errorf("the migrate Job's container does not run outbox migrate: %+v", jc)
		} else {
			flagArgs(t, "migrate-job.yaml", "migrate", jc[0].Args[1:])
		}
	}

	// The relay as the Deployment runs it, on this machine's PostgreSQL and
	// NATS.
	_, schema := outboxtest.Schema(t)
	js := natstest.JetStream(t, natstest.Conn(t))
	ncfg := natstest.Config(t)
	natstest.DeleteStreamAtCleanup(t, js, ncfg.Stream)
	secrets := map[string]string{
		"DATABASE_URL":       outboxtest.DatabaseURL(),
		"OUTBOX_DESTINATION": outboxtest.NATSURL() + "?stream=" + url.QueryEscape(ncfg.Stream) + "&subject_prefix=" + url.QueryEscape(ncfg.SubjectPrefix),
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "OUTBOX_FAILPOINTS="}
	for _, e := range c.Env {
		switch {
		case e.Name == "OUTBOX_SCHEMA":
			env = append(env, e.Name+"="+schema)
		case e.Value != nil:
			env = append(env, e.Name+"="+*e.Value)
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			v, ok := secrets[e.Name]
			if !ok {
				t.Fatalf("the Deployment takes %s from a Secret: the test has no value for it", e.Name)
			}
			env = append(env, e.Name+"="+v)
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, e.Name+"=outbox-relay-7d9f8c6b5-x2x4q")
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			limit, ok := c.Resources.Limits["memory"]
			if !ok {
				t.Fatalf("%s from limits.memory, but the container has no memory limit", e.Name)
			}
			env = append(env, e.Name+"="+strconv.FormatInt(memoryBytes(t, limit), 10))
		default:
			t.Fatalf("env %s: the test does not know what Kubernetes gives it", e.Name)
		}
	}
	if !slices.ContainsFunc(c.Env, func(e k8sEnv) bool { return e.Name == "OUTBOX_SCHEMA" }) {
		env = append(env, "OUTBOX_SCHEMA="+schema)
	}
	args := slices.Clone(c.Args[1:])
	for i, a := range args {
		if strings.HasPrefix(a, "--metrics-addr") {
			args[i] = "--metrics-addr=127.0.0.1:0" // the manifest's port may be taken here
		}
	}
	relay := startRelayProcessEnv(t, env, append(args, "--poll-interval", "50ms")...)
	addr := relay.metricsAddr(t)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, relay.log())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(c.LivenessProbe.HTTPGet.Path); code != http.StatusOK {
		t.Fatalf("liveness probe %s: %d %s", c.LivenessProbe.HTTPGet.Path, code, body)
	}
	outboxtest.Eventually(t, 60*time.Second, "the readiness probe's path answers 200", func() bool {
		code, _ := get(c.ReadinessProbe.HTTPGet.Path)
		return code == http.StatusOK
	})
	if code, body := get(sm.Spec.Endpoints[0].Path); code != http.StatusOK || !strings.Contains(body, "outbox_relays_alive") {
		t.Errorf("the ServiceMonitor's path %s: %d, without outbox_relays_alive", sm.Spec.Endpoints[0].Path, code)
	}
	if code, _ := get("/ready"); code != http.StatusNotFound {
		t.Errorf("GET /ready: %d, want 404 (the server answers only its paths)", code)
	}

	// The Dockerfile's HEALTHCHECK, run against this relay.
	hc := readDockerfile(t, "Dockerfile").healthcheck
	target, err := url.Parse(hc[len(hc)-1])
	if err != nil {
		t.Fatal(err)
	}
	target.Host = addr
	if stdout, stderr, code := runOutbox(t, nil, append(slices.Clone(hc[1:len(hc)-1]), target.String())...); code != 0 {
		t.Errorf("the HEALTHCHECK %q against the relay: exit %d %s%s", hc, code, stdout, stderr)
	}
	// Its default URL: OUTBOX_METRICS_ADDR's /healthz.
	if _, stderr, code := runOutbox(t, []string{"OUTBOX_METRICS_ADDR=" + addr}, "healthcheck"); code != 0 {
		t.Errorf("outbox healthcheck with OUTBOX_METRICS_ADDR=%s: exit %d %s", addr, code, stderr)
	}
	// And it fails, in one line, where it should.
	target.Path = "/nothing-here"
	if _, stderr, code := runOutbox(t, nil, "healthcheck", "--url", target.String()); code != 1 || !strings.Contains(stderr, "404") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("outbox healthcheck of a path not served: exit %d %q, want 1 and one line saying 404", code, stderr)
	}
	closed := "http://127.0.0.1:" + strconv.Itoa(freePort(t)) + "/healthz"
	if _, stderr, code := runOutbox(t, nil, "healthcheck", "--url", closed); code != 1 || !strings.Contains(stderr, "refused") {
		t.Errorf("outbox healthcheck of a closed port: exit %d %q, want 1 saying refused", code, stderr)
	}
}

// dockerfile is what the test reads of deploy/docker/Dockerfile.
type dockerfile struct {
	froms       []string // each FROM's image
	runs        []string
	user        string
	env         map[string]string
	expose      []string
	healthcheck []string // its CMD, exec form
	entrypoint  []string
	cmd         []string
	copies      []string // each COPY's destination
}

// readDockerfile parses deploy/docker/<name>: instructions, continuation
// lines joined, comments dropped; exec forms as JSON arrays.
func readDockerfile(t *testing.T, name string) dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, "docker", name))
	if err != nil {
		t.Fatal(err)
	}
	d := dockerfile{env: map[string]string{}}
	execForm := func(what, s string) []string {
		var v []string
		if err := json.Unmarshal([]byte(s), &v); err != nil || len(v) == 0 {
			t.Fatalf("Dockerfile: %s %s is not in exec form (a JSON array): %v", what, s, err)
		}
		return v
	}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, l := range logical {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			d.froms = append(d.froms, strings.Fields(rest)[0])
		case "RUN":
			d.runs = append(d.runs, rest)
		case "USER":
			d.user = rest
		case "ENV":
			k, v, _ := strings.Cut(rest, "=")
			d.env[k] = v
		case "EXPOSE":
			d.expose = append(d.expose, strings.Fields(rest)...)
		case "HEALTHCHECK":
			_, cmd, ok := strings.Cut(rest, "CMD ")
			if !ok {
				t.Fatalf("Dockerfile: HEALTHCHECK without CMD: %s", rest)
			}
			d.healthcheck = execForm("HEALTHCHECK CMD", strings.TrimSpace(cmd))
		case "ENTRYPOINT":
			d.entrypoint = execForm("ENTRYPOINT", rest)
		case "CMD":
			d.cmd = execForm("CMD", rest)
		case "COPY":
			f := strings.Fields(rest)
			d.copies = append(d.copies, f[len(f)-1])
		}
	}
	return d
}

// TestDockerfileImage: the image is the static binary (CGO_ENABLED=0) on an
// empty base, run as a numeric user that is not root, serving the metrics
// port it exposes (OUTBOX_METRICS_ADDR), whose /healthz its HEALTHCHECK
// asks with the binary itself (scratch has no curl); it runs outbox relay
// by default; Dockerfile.prebuilt is its final stage alone.
// (TestKubernetesManifestsMatchTheRelay runs that HEALTHCHECK against a
// relay.)
func TestDockerfileImage(t *testing.T) {
	t.Parallel()
	d := readDockerfile(t, "Dockerfile")
	if len(d.froms) == 0 || (d.froms[len(d.froms)-1] != "scratch" && !strings.HasPrefix(d.froms[len(d.froms)-1], "gcr.io/distroless/static")) {
		t.Errorf("the image's base is %v, want scratch or distroless/static", d.froms)
	}
	if !slices.ContainsFunc(d.runs, func(r string) bool {
		return strings.Contains(r, "CGO_ENABLED=0") && strings.Contains(r, "go build") && strings.Contains(r, "./cmd/outbox")
	}) {
		t.Errorf("no RUN builds ./cmd/outbox with CGO_ENABLED=0: %q", d.runs)
	}
	uid, _, _ := strings.Cut(d.user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q: want a numeric user that is not root (Kubernetes' runAsNonRoot checks a number)", d.user)
	}
	if len(d.entrypoint) != 1 || !slices.Contains(d.copies, d.entrypoint[0]) || !slices.Equal(d.cmd, []string{"relay"}) {
		t.Errorf("ENTRYPOINT %q CMD %q: want the copied binary running relay", d.entrypoint, d.cmd)
	}
	port := portOf(t, "ENV OUTBOX_METRICS_ADDR", d.env["OUTBOX_METRICS_ADDR"])
	if !slices.Contains(d.expose, strconv.Itoa(port)) {
		t.Errorf("EXPOSE %v does not expose the metrics port %d", d.expose, port)
	}
	hc := d.healthcheck
	if len(hc) < 2 || hc[0] != d.entrypoint[0] || hc[1] != "healthcheck" {
		t.Fatalf("HEALTHCHECK %q: want the binary's healthcheck command", hc)
	}
	u, err := url.Parse(hc[len(hc)-1])
	if err != nil || u.Path != "/healthz" || u.Port() != strconv.Itoa(port) || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
		t.Errorf("HEALTHCHECK asks %q, want /healthz on 127.0.0.1:%d", hc[len(hc)-1], port)
	}
	flagArgs(t, "Dockerfile HEALTHCHECK", "healthcheck", hc[2:])

	// Dockerfile.prebuilt is the final stage alone, the binary and the CA
	// roots taken from the build context.
	p := readDockerfile(t, "Dockerfile.prebuilt")
	if !slices.Equal(p.froms, d.froms[len(d.froms)-1:]) || p.user != d.user || !maps.Equal(p.env, d.env) || !slices.Equal(p.expose, d.expose) ||
		!slices.Equal(p.healthcheck, d.healthcheck) || !slices.Equal(p.entrypoint, d.entrypoint) || !slices.Equal(p.cmd, d.cmd) ||
		!slices.Equal(p.copies, d.copies[len(d.copies)-len(p.copies):]) || len(p.runs) != 0 {
		t.Errorf("Dockerfile.prebuilt is not Dockerfile's final stage:\n%+v\n%+v", p, d)
	}
}

// systemdUnit is a unit file: section -> key -> values, in order.
type systemdUnit map[string]map[string][]string

func readSystemdUnit(t *testing.T, path string) systemdUnit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := systemdUnit{}
	section := ""
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, `\`) {
				t.Fatalf("%s:%d: not a Key=Value line of a section: %q", path, i+1, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u systemdUnit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// TestSystemdUnit: the unit runs `outbox relay` with flags it has (they
// parse), keeps the secrets in its EnvironmentFile (no database URL or
// destination on the command line or in Environment=), whose example names
// only variables the relay reads; it is hardened (a dynamic user, no new
// privileges, a read-only system), restarts on failure and waits longer
// than the relay's shutdown; systemd-analyze verify accepts it, where the
// machine has it.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(deployDir, "systemd", "outbox-relay.service")
	u := readSystemdUnit(t, path)
	exec0 := strings.Fields(u.get("Service", "ExecStart"))
	if len(exec0) < 2 || !filepath.IsAbs(exec0[0]) || filepath.Base(exec0[0]) != "outbox" || exec0[1] != "relay" {
		t.Fatalf("ExecStart %q: want /path/to/outbox relay ...", exec0)
	}
	flagArgs(t, "ExecStart", "relay", exec0[2:])
	for _, secret := range []string{"database-url", "destination"} {
		if _, ok := flagValue(exec0, secret); ok {
			t.Errorf("ExecStart passes --%s: a secret on the command line (ps shows it); it belongs in the EnvironmentFile", secret)
		}
	}
	for _, e := range u["Service"]["Environment"] {
		if strings.Contains(e, "DATABASE_URL") || strings.Contains(e, "OUTBOX_DESTINATION") {
			t.Errorf("Environment=%s: a secret in the unit (systemctl show prints it); it belongs in the EnvironmentFile", e)
		}
	}
	if u.get("Service", "EnvironmentFile") == "" {
		t.Error("no EnvironmentFile: where would DATABASE_URL come from?")
	}
	if user := u.get("Service", "User"); u.get("Service", "DynamicUser") != "yes" && (user == "" || user == "root") {
		t.Error("the relay runs as root: want DynamicUser=yes or a User= of its own")
	}
	for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "Restart": "on-failure", "ProtectHome": "yes", "PrivateTmp": "yes"} {
		if got := u.get("Service", k); got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	stop, err := time.ParseDuration(u.get("Service", "TimeoutStopSec"))
	if err != nil || stop <= outbox.ShutdownTimeoutDefault {
		t.Errorf("TimeoutStopSec=%q: want a duration longer than the relay's --shutdown-timeout %s", u.get("Service", "TimeoutStopSec"), outbox.ShutdownTimeoutDefault)
	}

	// The example environment file names only what the relay reads.
	_, relayEnv := commandHelp(t, "relay")
	b, err := os.ReadFile(filepath.Join(deployDir, "systemd", "relay.env.example"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		k, _, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(k, " \t") || k == "" {
			continue // prose
		}
		keys = append(keys, k)
		if !relayEnv[k] {
			t.Errorf("relay.env.example sets %s, which outbox relay --help does not name", k)
		}
	}
	if !slices.Contains(keys, "DATABASE_URL") || !slices.Contains(keys, "OUTBOX_DESTINATION") {
		t.Errorf("relay.env.example sets %v, want DATABASE_URL and OUTBOX_DESTINATION", keys)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Logf("no systemd-analyze on this machine: the unit is not verified by systemd")
		return
	}
	// verify checks the binary exists: the one the tests built, in a copy.
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "outbox-relay.service")
	if err := os.WriteFile(copyPath, bytes.ReplaceAll(src, []byte(exec0[0]+" "), []byte(outboxBinary(t)+" ")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
