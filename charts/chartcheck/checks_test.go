package chartcheck

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/sluice-rl/sluice/descriptors"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// flagValue returns the value of --name in args, as `--name=value`.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// selects reports whether sel selects a pod with these labels.
func selects(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

// podSpecs returns every pod template of the rendering, by object.
func podSpecs(m manifests) map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for _, d := range all[*appsv1.Deployment](m) {
		out["Deployment "+d.Name] = d.Spec.Template
	}
	for _, j := range all[*batchv1.Job](m) {
		out["Job "+j.Name] = j.Spec.Template
	}
	for _, p := range all[*corev1.Pod](m) {
		out["Pod "+p.Name] = corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	}
	return out
}

func containerPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// addrPort is the port of a listen address such as ":8081".
func addrPort(t *testing.T, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return int32(n)
}

// checkServer: the serving Deployment listens where its ports and probes
// say, is probed on the right paths, rolls without dropping a replica,
// and gives the drain the time it needs before the kubelet kills it.
func checkServer(t *testing.T, m manifests) {
	d := serverDeployment(t, m)
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]

	for _, port := range []struct{ flag, name string }{{"grpc-addr", "grpc"}, {"http-addr", "http"}} {
		addr, ok := flagValue(c.Args, port.flag)
		if !ok {
			t.Errorf("serve has no --%s: the container's ports would rest on the binary's defaults", port.flag)
			continue
		}
		if n, ok := containerPort(c, port.name); !ok || n != addrPort(t, addr) {
			t.Errorf("container port %s is %d, serve listens on --%s=%s", port.name, n, port.flag, addr)
		}
	}
	probes := []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"startupProbe", c.StartupProbe, "/healthz"},
		{"readinessProbe", c.ReadinessProbe, "/readyz"},
		{"livenessProbe", c.LivenessProbe, "/healthz"},
	}
	for _, p := range probes {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: none, or not an HTTP GET", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s: GET %s, want %s", p.name, p.probe.HTTPGet.Path, p.path)
		}
		if _, ok := containerPort(c, p.probe.HTTPGet.Port.String()); !ok {
			t.Errorf("%s: port %s is not a port of the container", p.name, p.probe.HTTPGet.Port.String())
		}
	}

	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate == nil ||
		d.Spec.Strategy.RollingUpdate.MaxUnavailable == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v: a rollout must keep every serving replica until its replacement is ready (maxUnavailable 0)", d.Spec.Strategy)
	}

	shutdown := 10 * time.Second // serve's default
	if v, ok := flagValue(c.Args, "shutdown-timeout"); ok {
		var err error
		if shutdown, err = time.ParseDuration(v); err != nil {
			t.Fatalf("--shutdown-timeout=%s: %v", v, err)
		}
	}
	var sleep time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		sleep = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= sleep+shutdown {
		t.Errorf("terminationGracePeriodSeconds %v is not above the preStop sleep (%v) plus --shutdown-timeout (%v)", spec.TerminationGracePeriodSeconds, sleep, shutdown)
	}

	zones := false
	for _, tsc := range spec.TopologySpreadConstraints {
		zones = zones || tsc.TopologyKey == "topology.kubernetes.io/zone"
		if !selects(t, tsc.LabelSelector, d.Spec.Template.Labels) {
			t.Errorf("topology spread over %s selects none of the servers", tsc.TopologyKey)
		}
	}
	if !zones {
		t.Error("the servers are not spread over zones")
	}
}

// checkSelectorsAndPorts: what selects pods selects the right ones, and
// every port named exists where it is looked for.
func checkSelectorsAndPorts(t *testing.T, m manifests) {
	server := serverDeployment(t, m)
	pods := podSpecs(m)
	for _, d := range all[*appsv1.Deployment](m) {
		if !selects(t, d.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("Deployment %s: its selector does not select its own pods", d.Name)
		}
		for _, other := range all[*appsv1.Deployment](m) {
			if other != d && selects(t, d.Spec.Selector, other.Spec.Template.Labels) {
				t.Errorf("Deployment %s: its selector also selects %s's pods", d.Name, other.Name)
			}
		}
	}
	onlyServers := func(what string, sel *metav1.LabelSelector) {
		t.Helper()
		if !selects(t, sel, server.Spec.Template.Labels) {
			t.Errorf("%s does not select the servers", what)
		}
		for name, p := range pods {
			if name != "Deployment "+server.Name && selects(t, sel, p.Labels) {
				t.Errorf("%s also selects the pods of %s", what, name)
			}
		}
	}
	serverContainer := server.Spec.Template.Spec.Containers[0]

	services := all[*corev1.Service](m)
	if len(services) != 1 {
		t.Fatalf("%d Services, want 1", len(services))
	}
	svc := services[0]
	onlyServers("Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
	grpc := false
	for _, p := range svc.Spec.Ports {
		if _, ok := containerPort(serverContainer, p.TargetPort.String()); !ok {
			t.Errorf("Service port %s targets %s, which the server container does not have", p.Name, p.TargetPort.String())
		}
		if p.Name == "grpc" {
			grpc = p.AppProtocol != nil && *p.AppProtocol == "grpc"
		}
	}
	if !grpc {
		t.Error("the Service has no port grpc with appProtocol grpc: Istio and Envoy Gateway would not speak HTTP/2 to it")
	}

	for _, pdb := range all[*policyv1.PodDisruptionBudget](m) {
		onlyServers("PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector)
		if pdb.Spec.MinAvailable != nil {
			t.Errorf("PodDisruptionBudget %s: minAvailable blocks draining a single replica's node", pdb.Name)
		}
	}
	for _, hpa := range all[*autoscalingv2.HorizontalPodAutoscaler](m) {
		ref := hpa.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != server.Name {
			t.Errorf("HorizontalPodAutoscaler %s scales %s %s %s, not the servers' Deployment %s", hpa.Name, ref.APIVersion, ref.Kind, ref.Name, server.Name)
		}
		if server.Spec.Replicas != nil {
			t.Errorf("Deployment %s sets replicas beside an autoscaler: every upgrade would reset what the autoscaler chose", server.Name)
		}
	}

	for _, np := range all[*networkingv1.NetworkPolicy](m) {
		var selected []corev1.Container
		for name, p := range pods {
			if !selects(t, &np.Spec.PodSelector, p.Labels) {
				t.Errorf("NetworkPolicy %s does not cover %s", np.Name, name)
			}
			selected = append(selected, p.Spec.Containers...)
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil || p.Port.IntValue() != 0 {
					continue // a number, or every port
				}
				found := slices.ContainsFunc(selected, func(c corev1.Container) bool { _, ok := containerPort(c, p.Port.String()); return ok })
				if !found {
					t.Errorf("NetworkPolicy %s admits port %s, which no container has", np.Name, p.Port.String())
				}
			}
		}
		dns := false
		for _, rule := range np.Spec.Egress {
			for _, p := range rule.Ports {
				dns = dns || (p.Port != nil && p.Port.IntValue() == 53)
			}
		}
		if !dns {
			t.Errorf("NetworkPolicy %s lets no DNS out: the pods could not find their store", np.Name)
		}
		want := storePorts(t, m)
		if addr, ok := flagValue(serverDeployment(t, m).Spec.Template.Spec.Containers[0].Args, "xds-server"); ok {
			want = append(want, int(addrPort(t, addr)))
		}
		for _, port := range want {
			if !slices.ContainsFunc(np.Spec.Egress, func(r networkingv1.NetworkPolicyEgressRule) bool {
				return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.IntValue() == port })
			}) {
				t.Errorf("NetworkPolicy %s keeps the pods from a store or xDS server they are given, on port %d", np.Name, port)
			}
		}
	}

	for _, sm := range all[*monitoringv1.ServiceMonitor](m) {
		if !selects(t, &sm.Spec.Selector, svc.Labels) {
			t.Errorf("ServiceMonitor %s does not select Service %s", sm.Name, svc.Name)
		}
		for _, e := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) {
				t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s does not have", sm.Name, e.Port, svc.Name)
			}
		}
	}
	for _, pm := range all[*monitoringv1.PodMonitor](m) {
		for _, d := range all[*appsv1.Deployment](m) {
			if !selects(t, &pm.Spec.Selector, d.Spec.Template.Labels) {
				t.Errorf("PodMonitor %s does not scrape Deployment %s", pm.Name, d.Name)
			}
			for _, e := range pm.Spec.PodMetricsEndpoints {
				port := ""
				if e.Port != nil {
					port = *e.Port
				}
				if _, ok := containerPort(d.Spec.Template.Spec.Containers[0], port); !ok {
					t.Errorf("PodMonitor %s scrapes port %q, which Deployment %s's container does not have", pm.Name, port, d.Name)
				}
			}
		}
	}
}

// checkPods: every container runs as the image does (non-root, read-only
// root, no capabilities, seccomp) and finds the files its flags name.
func checkPods(t *testing.T, m manifests) {
	for name, p := range podSpecs(m) {
		psc := p.Spec.SecurityContext
		if psc == nil {
			psc = &corev1.PodSecurityContext{}
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range p.Spec.Volumes {
			volumes[v.Name] = v
		}
		for _, c := range p.Spec.Containers {
			where := name + " container " + c.Name
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			if !isTrue(sc.RunAsNonRoot) && !isTrue(psc.RunAsNonRoot) {
				t.Errorf("%s: may run as root", where)
			}
			if !isTrue(sc.ReadOnlyRootFilesystem) {
				t.Errorf("%s: the root file system is writable", where)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: privilege escalation is allowed", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities %+v, want ALL dropped and none added", where, sc.Capabilities)
			}
			seccomp := sc.SeccompProfile
			if seccomp == nil {
				seccomp = psc.SeccompProfile
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: no RuntimeDefault seccomp profile", where)
			}
			for _, vm := range c.VolumeMounts {
				if _, ok := volumes[vm.Name]; !ok {
					t.Errorf("%s: mounts volume %s, which the pod does not have", where, vm.Name)
				}
			}
			// Every file a flag names is under a mount, else the pod would
			// fail at start with "no such file".
			for _, a := range c.Args {
				_, v, ok := strings.Cut(a, "=")
				if !ok || !strings.HasPrefix(v, "/etc/sluice/") {
					continue
				}
				if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return v == vm.MountPath || strings.HasPrefix(v, vm.MountPath+"/") }) {
					t.Errorf("%s: %s names a file no volume is mounted for", where, a)
				}
			}
		}
	}
}

func isTrue(b *bool) bool { return b != nil && *b }

// checkRules: the servers read the rules from a directory the ConfigMap
// is mounted on whole (a subPath mount is never updated, so an edit
// would never be hot-reloaded), and the rules it holds load with Sluice's
// own loader from a directory laid out as the kubelet lays one out.
func checkRules(t *testing.T, m manifests, vals map[string]any) {
	d := serverDeployment(t, m)
	c := d.Spec.Template.Spec.Containers[0]
	dir, fromDir := flagValue(c.Args, "config-dir")
	_, fromXDS := flagValue(c.Args, "xds-server")
	if fromDir == fromXDS {
		t.Fatalf("serve has --config-dir %v and --xds-server %v: want exactly one", fromDir, fromXDS)
	}
	if fromXDS {
		if _, ok := flagValue(c.Args, "xds-node-id"); !ok {
			t.Error("--xds-server without --xds-node-id: serve refuses to start")
		}
		return
	}
	var mount *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if vm.MountPath == dir {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("nothing is mounted at --config-dir=%s", dir)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" {
		t.Fatalf("the rules are mounted with a subPath: the kubelet never updates those, so edits are not hot-reloaded")
	}
	var cmName string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	if cmName == "" {
		t.Fatalf("volume %s at --config-dir is not a ConfigMap", mount.Name)
	}
	rules, _ := vals["rules"].(map[string]any)
	if existing, _ := rules["existingConfigMap"].(string); existing != "" {
		if cmName != existing {
			t.Errorf("the rules volume is ConfigMap %s, not rules.existingConfigMap %s", cmName, existing)
		}
		for _, cm := range all[*corev1.ConfigMap](m) {
			if cm.Name == cmName {
				t.Errorf("the chart renders ConfigMap %s, which the user manages", cmName)
			}
		}
		return
	}
	var cm *corev1.ConfigMap
	for _, o := range all[*corev1.ConfigMap](m) {
		if o.Name == cmName {
			cm = o
		}
	}
	if cm == nil {
		t.Fatalf("the rules volume names ConfigMap %s, which the chart does not render", cmName)
	}
	cfg, err := descriptors.Load(kubeletConfigMapDir(t, cm.Data))
	if err != nil {
		t.Fatalf("the rules in ConfigMap %s do not load: %v", cm.Name, err)
	}
	want := []string{"api", "edge"} // examples/config's
	if files, _ := rules["files"].(map[string]any); len(files) > 0 {
		want = nil
		for _, text := range files {
			parsed, err := descriptors.Parse(map[string][]byte{"f.yaml": []byte(text.(string))})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, parsed.Domains()...)
		}
		slices.Sort(want)
	}
	if got := cfg.Domains(); !slices.Equal(got, want) {
		t.Errorf("the rules mounted define domains %v, want %v", got, want)
	}
}

// kubeletConfigMapDir lays data out as the kubelet mounts a ConfigMap: the
// files in a timestamped directory, a ..data link to it, and one link per
// key through ..data, which is what it swaps on an update.
func kubeletConfigMapDir(t *testing.T, data map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range data {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

var jobSelector = regexp.MustCompile(`job="([^"]*)"`)

// checkMonitoring: the PrometheusRule holds examples/observability's
// rules, selecting the job the monitors give the targets, and the
// dashboards ConfigMap holds its dashboard, labelled for Grafana's sidecar.
func checkMonitoring(t *testing.T, m manifests, vals map[string]any) {
	job := "sluice"
	mon, _ := vals["monitoring"].(map[string]any)
	if j, ok := mon["job"].(string); ok {
		job = j
	}
	for _, sm := range all[*monitoringv1.ServiceMonitor](m) {
		for _, e := range sm.Spec.Endpoints {
			checkJobRelabel(t, "ServiceMonitor "+sm.Name, e.RelabelConfigs, job)
		}
	}
	for _, pm := range all[*monitoringv1.PodMonitor](m) {
		for _, e := range pm.Spec.PodMetricsEndpoints {
			checkJobRelabel(t, "PodMonitor "+pm.Name, e.RelabelConfigs, job)
		}
	}
	for _, pr := range all[*monitoringv1.PrometheusRule](m) {
		raw, err := os.ReadFile("../../examples/observability/sluice-alerts.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var want monitoringv1.PrometheusRuleSpec
		if err := yaml.UnmarshalStrict(raw, &want); err != nil {
			t.Fatalf("examples/observability/sluice-alerts.yaml is not a PrometheusRule's spec: %v", err)
		}
		for i, g := range want.Groups {
			for j, r := range g.Rules {
				want.Groups[i].Rules[j].Expr.StrVal = strings.ReplaceAll(r.Expr.StrVal, `job="sluice"`, fmt.Sprintf("job=%q", job))
			}
		}
		if !reflect.DeepEqual(pr.Spec, want) {
			t.Errorf("PrometheusRule %s is not examples/observability/sluice-alerts.yaml with job %q", pr.Name, job)
		}
		for _, g := range pr.Spec.Groups {
			for _, r := range g.Rules {
				for _, sel := range jobSelector.FindAllStringSubmatch(r.Expr.String(), -1) {
					if sel[1] != job {
						t.Errorf("rule %s%s selects job %q, the monitors set %q", r.Alert, r.Record, sel[1], job)
					}
				}
			}
		}
	}
	for _, cm := range all[*corev1.ConfigMap](m) {
		text, ok := cm.Data["sluice-dashboard.json"]
		if !ok {
			continue
		}
		raw, err := os.ReadFile("../../examples/observability/sluice-dashboard.json")
		if err != nil {
			t.Fatal(err)
		}
		// Helm trims the space around every document it splits, so the
		// block that ends one loses its final newline, in a real install too.
		if text != strings.TrimRight(string(raw), "\n") {
			t.Errorf("ConfigMap %s's dashboard is not examples/observability/sluice-dashboard.json (%d bytes against %d)", cm.Name, len(text), len(raw))
		}
		if !json.Valid([]byte(text)) {
			t.Errorf("ConfigMap %s's dashboard is not JSON", cm.Name)
		}
		if cm.Labels["grafana_dashboard"] == "" {
			t.Errorf("ConfigMap %s has no grafana_dashboard label: Grafana's sidecar would not load it", cm.Name)
		}
	}
}

func checkJobRelabel(t *testing.T, what string, relabels []monitoringv1.RelabelConfig, job string) {
	t.Helper()
	for _, r := range relabels {
		if r.TargetLabel == "job" && r.Replacement != nil && *r.Replacement == job {
			return
		}
	}
	t.Errorf("%s does not set job %q, which the alerts select", what, job)
}

// checkHelmTest: `helm test` asks the release's Service, on its HTTP
// port, whether Sluice is ready.
func checkHelmTest(t *testing.T, m manifests) {
	svc := all[*corev1.Service](m)[0]
	var tests []*corev1.Pod
	for _, p := range all[*corev1.Pod](m) {
		if slices.Contains(m.hooks["Pod/"+p.Name], "test") {
			tests = append(tests, p)
		}
	}
	if len(tests) != 1 {
		t.Fatalf("%d helm test Pods, want 1", len(tests))
	}
	args := tests[0].Spec.Containers[0].Args
	if len(args) == 0 || args[0] != "health" {
		t.Fatalf("the test runs %v, not sluice health", args)
	}
	addr, _ := flagValue(args, "http-addr")
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--http-addr=%s: %v", addr, err)
	}
	if host != svc.Name+"."+namespace+".svc" {
		t.Errorf("the test asks %s, not Service %s", host, svc.Name)
	}
	if path, _ := flagValue(args, "path"); path != "/readyz" {
		t.Errorf("the test probes %q, want /readyz", path)
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return strconv.Itoa(int(p.Port)) == port && p.TargetPort.String() == "http"
	}) {
		t.Errorf("the test asks port %s, which is not the Service's port to http", port)
	}
}

// checkNotes: NOTES.txt tells how to point Envoy, Istio and Envoy Gateway
// at the release's gRPC port.
func checkNotes(t *testing.T, m manifests) {
	svc := all[*corev1.Service](m)[0]
	var grpc int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			grpc = p.Port
		}
	}
	for _, want := range []string{
		fmt.Sprintf("%s.%s.svc.cluster.local:%d", svc.Name, namespace, grpc),
		fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", grpc, svc.Name, namespace),
		"Envoy Gateway",
		"http2_protocol_options",
	} {
		if !strings.Contains(m.notes, want) {
			t.Errorf("NOTES.txt does not say %q", want)
		}
	}
}

// decodeStrict is sigs.k8s.io/json's strict decoding, the API server's.
func decodeStrict(raw []byte, into any) error {
	strict, err := sigsjson.UnmarshalStrict(raw, into)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return fmt.Errorf("%v", strict)
	}
	return nil
}

// storePorts returns the ports of the stores the pods are told to reach:
// the servers' and the sync's own (--redis-url, or DynamoDB's 443 with
// --table) and the other regions' that the sync reads (--global-store).
func storePorts(t *testing.T, m manifests) []int {
	t.Helper()
	var ports []int
	for _, d := range all[*appsv1.Deployment](m) {
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			raw, ok := strings.CutPrefix(a, "--redis-url=")
			if v, store := strings.CutPrefix(a, "--global-store="); store {
				_, raw, ok = strings.Cut(v, "=")
			}
			if strings.HasPrefix(a, "--table=") {
				raw, ok = "dynamodb://", true
			}
			if !ok {
				continue
			}
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatalf("%s: %v", a, err)
			}
			hosts := append([]string{u.Host}, u.Query()["addr"]...) // Cluster seeds
			switch u.Scheme {
			case "unix":
				continue
			case "dynamodb":
				ports = append(ports, 443)
				continue
			}
			for _, h := range hosts {
				_, port, err := net.SplitHostPort(h)
				if err != nil {
					port = "6379" // no port given
				}
				n, err := strconv.Atoi(port)
				if err != nil {
					t.Fatalf("%s: port %q: %v", a, port, err)
				}
				ports = append(ports, n)
			}
		}
	}
	return ports
}
