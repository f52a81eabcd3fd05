package examples

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istiov1alpha3 "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sluice-rl/sluice/descriptors"
)

// There is no cluster here, so the Istio example is checked the way the
// API server and istiod would read it: every document decoded strictly
// into its Kubernetes or Istio type (an unknown or misspelt field fails),
// every Envoy patch decoded into Envoy's own type and validated by
// Envoy's rules, and the names that tie the files together (ConfigMap,
// ports, Istio's cluster name for the Service, domains) compared. Then
// the patched virtual hosts compute descriptors for sample requests, and
// Sluice with the ConfigMap's rules decides them.

// manifest is one document of a YAML manifest file, as JSON.
type manifest struct {
	file       string
	apiVersion string
	kind       string
	name       string
	json       []byte
}

func (m manifest) String() string { return fmt.Sprintf("%s: %s %s", m.file, m.kind, m.name) }

func loadManifests(t *testing.T, path string) []manifest {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc == nil {
			continue
		}
		js, err := json.Marshal(doc)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(js, &head); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, manifest{filepath.Base(path), head.APIVersion, head.Kind, head.Metadata.Name, js})
	}
	return out
}

// strict decodes m into v, refusing fields v does not have.
func (m manifest) strict(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(m.json))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", m, err)
	}
}

// istioSluice is examples/istio/sluice.yaml, decoded.
type istioSluice struct {
	namespace      corev1.Namespace
	serviceAccount corev1.ServiceAccount
	configMap      corev1.ConfigMap
	deployment     appsv1.Deployment
	service        corev1.Service
	rules          *descriptors.Config
}

func loadIstioSluice(t *testing.T) *istioSluice {
	t.Helper()
	s := &istioSluice{}
	want := map[string]struct {
		apiVersion string
		into       any
	}{
		"Namespace":      {"v1", &s.namespace},
		"ServiceAccount": {"v1", &s.serviceAccount},
		"ConfigMap":      {"v1", &s.configMap},
		"Deployment":     {"apps/v1", &s.deployment},
		"Service":        {"v1", &s.service},
	}
	seen := map[string]bool{}
	for _, m := range loadManifests(t, "istio/sluice.yaml") {
		w, ok := want[m.kind]
		if !ok || seen[m.kind] {
			t.Fatalf("%s: want one each of Namespace, ServiceAccount, ConfigMap, Deployment and Service", m)
		}
		if m.apiVersion != w.apiVersion {
			t.Errorf("%s: apiVersion %q, want %q", m, m.apiVersion, w.apiVersion)
		}
		seen[m.kind] = true
		m.strict(t, w.into)
	}
	if len(seen) != len(want) {
		t.Fatalf("sluice.yaml has %d of the %d kinds", len(seen), len(want))
	}

	// The rules are the ConfigMap's files, loaded as Sluice loads its
	// mounted volume.
	dir := t.TempDir()
	for name, body := range s.configMap.Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rules, err := descriptors.Load(dir)
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", s.configMap.Name, err)
	}
	s.rules = rules
	return s
}

// clusterName is the cluster istiod makes for the Service's gRPC port:
// outbound|port|subset|FQDN.
func (s *istioSluice) clusterName(t *testing.T) string {
	t.Helper()
	if len(s.service.Spec.Ports) != 1 {
		t.Fatalf("Service %s: want one port, got %d", s.service.Name, len(s.service.Spec.Ports))
	}
	return fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", s.service.Spec.Ports[0].Port, s.service.Name, s.service.Namespace)
}

// readmeServeFlags lists the flags of docs/serve.md's `sluice serve` table.
func readmeServeFlags(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile("../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## `sluice serve`\n")
	if !ok {
		t.Fatal("docs/serve.md has no `sluice serve` section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`").FindAllStringSubmatch(section, -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatal("docs/serve.md's `sluice serve` section has no flag table")
	}
	return flags
}

func TestIstioSluiceManifests(t *testing.T) {
	s := loadIstioSluice(t)
	ns := s.namespace.Name
	for _, o := range []metav1.ObjectMeta{s.serviceAccount.ObjectMeta, s.configMap.ObjectMeta, s.deployment.ObjectMeta, s.service.ObjectMeta} {
		if o.Namespace != ns {
			t.Errorf("%s is in namespace %q, want %q", o.Name, o.Namespace, ns)
		}
	}
	if s.namespace.Labels["istio-injection"] != "enabled" {
		t.Errorf("namespace %s: sidecar injection is not enabled, so the gateway would call Sluice without mutual TLS", ns)
	}
	if got := s.rules.Domains(); !slices.Equal(got, []string{"ingress", "orders"}) {
		t.Errorf("ConfigMap domains %v, want ingress and orders", got)
	}

	d := s.deployment.Spec
	pod := d.Template.Spec
	sel, err := metav1.LabelSelectorAsSelector(d.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(d.Template.Labels)) {
		t.Errorf("Deployment selector %v does not select its pods %v", d.Selector.MatchLabels, d.Template.Labels)
	}
	if len(s.service.Spec.Selector) == 0 || !labels.SelectorFromSet(s.service.Spec.Selector).Matches(labels.Set(d.Template.Labels)) {
		t.Errorf("Service selector %v does not select the pods %v", s.service.Spec.Selector, d.Template.Labels)
	}
	if pod.ServiceAccountName != s.serviceAccount.Name {
		t.Errorf("pods run as %q, the file makes %q", pod.ServiceAccountName, s.serviceAccount.Name)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The image is the one `make image` builds, running `sluice serve`.
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "docker build -t "+c.Image+" ") {
		t.Errorf("image %q is not the one `make image` builds", c.Image)
	}
	if !slices.Equal(c.Args, []string{"serve"}) || len(c.Command) != 0 {
		t.Errorf("command %v args %v, want the image's entrypoint with serve", c.Command, c.Args)
	}

	// Every variable is a real flag of `sluice serve`, and the rules are
	// mounted where SLUICE_CONFIG_DIR points.
	flags := readmeServeFlags(t)
	env := map[string]string{}
	for _, e := range c.Env {
		flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(e.Name, "SLUICE_")), "_", "-")
		if !strings.HasPrefix(e.Name, "SLUICE_") || !flags[flag] {
			t.Errorf("env %s is no flag of sluice serve", e.Name)
		}
		env[e.Name] = e.Value
	}
	var mounted bool
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == s.configMap.Name && vm.MountPath == env["SLUICE_CONFIG_DIR"] {
				mounted = vm.ReadOnly
			}
		}
	}
	if !mounted {
		t.Errorf("ConfigMap %s is not mounted read-only at SLUICE_CONFIG_DIR %q", s.configMap.Name, env["SLUICE_CONFIG_DIR"])
	}
	if env["SLUICE_BACKEND"] != "dynamodb" && (d.Replicas == nil || *d.Replicas != 1) {
		t.Errorf("backend %q with %v replicas: on the memory backend each replica would count on its own", env["SLUICE_BACKEND"], d.Replicas)
	}
	if _, set := env["SLUICE_GRPC_ADDR"]; set {
		t.Errorf("SLUICE_GRPC_ADDR is set: the checks below assume the default :8081")
	}
	if _, set := env["SLUICE_HTTP_ADDR"]; set {
		t.Errorf("SLUICE_HTTP_ADDR is set: the checks below assume the default :8080")
	}

	// Ports: the defaults of --grpc-addr and --http-addr, named so the
	// Service and the probes refer to them.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["grpc"] != 8081 || ports["http"] != 8080 {
		t.Errorf("container ports %v, want grpc 8081 and http 8080", ports)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("want an HTTP probe of %s on port http, got %+v", p.path, p.probe)
		}
	}
	sp := s.service.Spec.Ports[0]
	if sp.TargetPort.String() != "grpc" || (sp.Name != "grpc" && !strings.HasPrefix(sp.Name, "grpc-")) ||
		sp.AppProtocol == nil || *sp.AppProtocol != "grpc" {
		t.Errorf("Service port %s (target %s, appProtocol %v): want target port grpc, named and declared grpc so Istio speaks HTTP/2",
			sp.Name, sp.TargetPort.String(), ptrString(sp.AppProtocol))
	}

	// Shutdown: the drain before SIGTERM and Sluice's own drain fit in
	// the grace period.
	shutdown, err := time.ParseDuration(env["SLUICE_SHUTDOWN_TIMEOUT"])
	if err != nil {
		t.Fatalf("SLUICE_SHUTDOWN_TIMEOUT: %v", err)
	}
	var preStop time.Duration
	if h := c.Lifecycle; h != nil && h.PreStop != nil && h.PreStop.Sleep != nil {
		preStop = time.Duration(h.PreStop.Sleep.Seconds) * time.Second
	}
	if preStop == 0 {
		t.Error("no preStop sleep: gateways would still send to a pod that has stopped taking calls")
	}
	var grace time.Duration
	if g := pod.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if grace <= preStop+shutdown {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than preStop %v + shutdown %v", grace, preStop, shutdown)
	}

	// Hardening: the image's non-root user, nothing writable, no
	// capabilities.
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("pod security %+v, container security %+v: want non-root, read-only, no escalation, no capabilities", psc, sc)
	}
}

func ptrString(p *string) string {
	if p == nil {
		return "unset"
	}
	return *p
}

// istioProxy is what the two EnvoyFilters of a file make of the proxies
// they select: the rate-limit filter in the HTTP filter chain, and a
// virtual host istiod generated with the file's rate_limits merged in.
type istioProxy struct {
	namespace string
	selector  map[string]string
	context   istiov1alpha3.EnvoyFilter_PatchContext
	vhostName string // the virtual host the patch is restricted to, if any
	filter    envoyRateLimitFilter
	vhost     *routev3.VirtualHost
}

// loadIstioProxy reads the EnvoyFilters of file and applies them to base,
// a virtual host as istiod generates it.
func loadIstioProxy(t *testing.T, file string, base *routev3.VirtualHost) *istioProxy {
	t.Helper()
	p := &istioProxy{}
	var filters, vhostPatches int
	for i, m := range loadManifests(t, file) {
		if m.apiVersion != "networking.istio.io/v1alpha3" || m.kind != "EnvoyFilter" {
			t.Fatalf("%s: apiVersion %s: want only networking.istio.io/v1alpha3 EnvoyFilters", m, m.apiVersion)
		}
		var doc struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
			Spec       json.RawMessage   `json:"spec"`
		}
		m.strict(t, &doc)
		spec := &istiov1alpha3.EnvoyFilter{}
		if err := protojson.Unmarshal(doc.Spec, spec); err != nil {
			t.Fatalf("%s: not an EnvoyFilter spec: %v", m, err)
		}
		sel := spec.GetWorkloadSelector().GetLabels()
		if i == 0 {
			p.namespace, p.selector = doc.Metadata.Namespace, sel
		} else if doc.Metadata.Namespace != p.namespace || !maps.Equal(sel, p.selector) {
			t.Errorf("%s selects %s %v, the first EnvoyFilter %s %v: the filter and its rate_limits must reach the same proxies",
				m, doc.Metadata.Namespace, sel, p.namespace, p.selector)
		}
		if len(sel) == 0 {
			t.Errorf("%s selects every proxy in its namespace: give it a workloadSelector", m)
		}
		for _, cp := range spec.GetConfigPatches() {
			ctx := cp.GetMatch().GetContext()
			if p.context == istiov1alpha3.EnvoyFilter_ANY {
				p.context = ctx
			} else if ctx != p.context {
				t.Errorf("%s: patches for %v and %v", m, p.context, ctx)
			}
			value, err := protojson.Marshal(cp.GetPatch().GetValue())
			if err != nil {
				t.Fatal(err)
			}
			switch cp.GetApplyTo() {
			case istiov1alpha3.EnvoyFilter_HTTP_FILTER:
				filters++
				fc := cp.GetMatch().GetListener().GetFilterChain().GetFilter()
				if fc.GetName() != "envoy.filters.network.http_connection_manager" ||
					fc.GetSubFilter().GetName() != "envoy.filters.http.router" ||
					cp.GetPatch().GetOperation() != istiov1alpha3.EnvoyFilter_Patch_INSERT_BEFORE {
					t.Errorf("%s: the rate-limit filter must be inserted before the router of the HTTP connection manager", m)
				}
				hf := &hcmv3.HttpFilter{}
				if err := protojson.Unmarshal(value, hf); err != nil {
					t.Fatalf("%s: patch value is not an Envoy HttpFilter: %v", m, err)
				}
				if err := hf.ValidateAll(); err != nil {
					t.Fatalf("%s: HttpFilter fails Envoy's validation rules: %v", m, err)
				}
				cfg := &ratelimitv3.RateLimit{}
				if err := hf.GetTypedConfig().UnmarshalTo(cfg); err != nil {
					t.Fatalf("%s: %s is not the rate-limit filter: %v", m, hf.GetName(), err)
				}
				p.filter = envoyRateLimitFilter{hf.GetName(), cfg}
			case istiov1alpha3.EnvoyFilter_VIRTUAL_HOST:
				vhostPatches++
				if cp.GetPatch().GetOperation() != istiov1alpha3.EnvoyFilter_Patch_MERGE {
					t.Errorf("%s: want the rate_limits merged into the virtual host", m)
				}
				patch := &routev3.VirtualHost{}
				if err := protojson.Unmarshal(value, patch); err != nil {
					t.Fatalf("%s: patch value is not part of an Envoy VirtualHost: %v", m, err)
				}
				p.vhostName = cp.GetMatch().GetRouteConfiguration().GetVhost().GetName()
				// MERGE is proto merge: istiod applies it to each
				// virtual host it generated.
				vh := proto.Clone(base).(*routev3.VirtualHost)
				proto.Merge(vh, patch)
				if err := vh.ValidateAll(); err != nil {
					t.Fatalf("%s: the patched virtual host fails Envoy's validation rules: %v", m, err)
				}
				p.vhost = vh
			default:
				t.Errorf("%s: unexpected patch of %v", m, cp.GetApplyTo())
			}
		}
	}
	if filters != 1 || vhostPatches != 1 {
		t.Fatalf("%s: %d HTTP_FILTER and %d VIRTUAL_HOST patches, want one of each", file, filters, vhostPatches)
	}
	return p
}

// checkFilter holds the filter to the choices README.md explains, and to
// sluice.yaml: its domain has rules, and it calls the Service's cluster.
func (p *istioProxy) checkFilter(t *testing.T, s *istioSluice, domain string) {
	t.Helper()
	c := p.filter.cfg
	if p.filter.name != "envoy.filters.http.ratelimit" {
		t.Errorf("filter name %q", p.filter.name)
	}
	if c.GetDomain() != domain || !slices.Contains(s.rules.Domains(), domain) {
		t.Errorf("domain %q: want %q, with rules in the ConfigMap (%v)", c.GetDomain(), domain, s.rules.Domains())
	}
	g := c.GetRateLimitService().GetGrpcService().GetEnvoyGrpc()
	if want := s.clusterName(t); g.GetClusterName() != want {
		t.Errorf("cluster %q, want %q, istiod's name for the Service in sluice.yaml", g.GetClusterName(), want)
	}
	if want := s.service.Name + "." + s.service.Namespace + ".svc.cluster.local"; g.GetAuthority() != want {
		t.Errorf("authority %q, want %q", g.GetAuthority(), want)
	}
	if c.GetRateLimitService().GetTransportApiVersion().String() != "V3" {
		t.Error("transport_api_version is not V3")
	}
	if d := c.GetTimeout().AsDuration(); d <= 0 || d > time.Second {
		t.Errorf("timeout %v: want a deadline well under a second", d)
	}
	if c.GetFailureModeDeny() || c.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 || !c.GetEnableRetryAfterHeader() {
		t.Error("want failure_mode_deny false, DRAFT_VERSION_03 headers and retry-after")
	}
}

// stack puts the proxy in front of Sluice with the ConfigMap's rules.
func (p *istioProxy) stack(t *testing.T, s *istioSluice) *envoyStack {
	return newEnvoyStackFor(t, &envoyModel{t: t, vhost: p.vhost, filters: []envoyRateLimitFilter{p.filter}}, s.rules)
}

// istioVirtualHost is a virtual host as istiod generates it: one route
// for every path to cluster.
func istioVirtualHost(name string, domains []string, route, cluster string) *routev3.VirtualHost {
	return &routev3.VirtualHost{
		Name:    name,
		Domains: domains,
		Routes: []*routev3.Route{{
			Name:  route,
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			}},
		}},
	}
}

func TestIstioGateway(t *testing.T) {
	s := loadIstioSluice(t)
	// A virtual host as istiod generates it at the gateway for a
	// VirtualService of shop.example.com.
	base := istioVirtualHost("shop.example.com:80", []string{"shop.example.com", "status.example.com"},
		"shop.shop.svc.cluster.local:8080", "outbound|8080||shop.shop.svc.cluster.local")
	p := loadIstioProxy(t, "istio/gateway.yaml", base)
	if p.namespace != "istio-system" || p.selector["istio"] != "ingressgateway" || p.context != istiov1alpha3.EnvoyFilter_GATEWAY {
		t.Errorf("EnvoyFilters for %s %v in context %v, want the ingress gateway from istio-system", p.namespace, p.selector, p.context)
	}
	p.checkFilter(t, s, "ingress")
	st := p.stack(t, s)

	// Per client address: 20 a second, bursts of 40.
	shop := func(addr string) func(int) envoyRequest {
		return func(int) envoyRequest {
			return envoyRequest{path: "/cart", ip: addr, headers: map[string]string{":authority": "shop.example.com"}}
		}
	}
	st.allowedRun("198.51.100.7", 41, 40, shop("198.51.100.7"))
	if got := st.overLimitName("ingress"); got != "per-ip" {
		t.Errorf("198.51.100.7 denied by %q, want per-ip", got)
	}
	st.allowedRun("another address", 40, 40, shop("198.51.100.8"))
	st.advance(100 * time.Millisecond) // two tokens back
	st.allowedRun("198.51.100.7 after 100ms", 3, 2, shop("198.51.100.7"))

	// Per host: 1000 a second from all clients together; full again
	// after two seconds.
	st.advance(2 * time.Second)
	many := func(host string) func(int) envoyRequest {
		return func(i int) envoyRequest {
			return envoyRequest{path: "/", ip: ip(i), headers: map[string]string{":authority": host}}
		}
	}
	st.allowedRun("shop.example.com from many addresses", 1001, 1000, many("shop.example.com"))
	if got := st.overLimitName("ingress"); got != "per-host" {
		t.Errorf("shop.example.com denied by %q, want per-host", got)
	}
	// The status page has no host limit, only the per-address one.
	st.allowedRun("status.example.com from many addresses", 2000, 2000, many("status.example.com"))
}

func TestIstioSidecar(t *testing.T) {
	s := loadIstioSluice(t)
	// The inbound virtual host istiod generates for port 8080 of a pod.
	base := istioVirtualHost("inbound|http|8080", []string{"*"}, "default", "inbound|8080||")
	p := loadIstioProxy(t, "istio/sidecar.yaml", base)
	if p.namespace == "istio-system" || p.selector["app"] != "orders" || p.context != istiov1alpha3.EnvoyFilter_SIDECAR_INBOUND {
		t.Errorf("EnvoyFilters for %s %v in context %v, want the orders workload's inbound sidecar", p.namespace, p.selector, p.context)
	}
	if p.vhostName != base.Name {
		t.Errorf("rate_limits patch the virtual host %q, want %q", p.vhostName, base.Name)
	}
	p.checkFilter(t, s, "orders")
	st := p.stack(t, s)

	// Per API key: 100 a minute, bursts of 120.
	key := func(k string) func(int) envoyRequest {
		return func(int) envoyRequest {
			return envoyRequest{path: "/orders", ip: "10.0.0.7", headers: map[string]string{"x-api-key": k}}
		}
	}
	st.allowedRun("k1", 121, 120, key("k1"))
	if got := st.overLimitName("orders"); got != "rpm" {
		t.Errorf("k1 denied by %q, want rpm", got)
	}
	st.allowedRun("k2 beside a spent k1", 120, 120, key("k2"))
	st.advance(600 * time.Millisecond)
	st.allowedRun("k1 after 600ms", 2, 1, key("k1"))

	// The whole workload: 500 a second, whoever asks (every request
	// above took one too); full again after a second.
	st.advance(time.Second)
	none := func(int) envoyRequest { return envoyRequest{path: "/orders", ip: "10.0.0.8"} }
	st.allowedRun("without a key", 501, 500, none)
	if got := st.overLimitName("orders"); got != "orders-total" {
		t.Errorf("denied by %q, want orders-total", got)
	}
}

// TestEveryEnvoyConfigIsChecked keeps the tests above complete: an Envoy
// config or EnvoyFilter added to the repository without a test that
// validates it fails here.
func TestEveryEnvoyConfigIsChecked(t *testing.T) {
	checked := map[string]bool{
		"envoy.yaml":                                       true, // TestEnvoyBootstrapIsValid
		"examples/istio/gateway.yaml":                      true, // TestIstioGateway
		"examples/istio/sidecar.yaml":                      true, // TestIstioSidecar
		"examples/istio/sluice.yaml":                       true, // TestIstioSluiceManifests
		"examples/docker-compose/compose.yaml":             true, // TestComposeDemo
		"examples/envoy-gateway/envoy-gateway-config.yaml": true, // TestEnvoyGatewayConfig
		"examples/envoy-gateway/gateway.yaml":              true, // TestEnvoyGatewayDemo
		"examples/envoy-gateway/backend.yaml":              true, // TestEnvoyGatewayDemo
		"examples/envoy-gateway/policy.yaml":               true, // TestEnvoyGatewayDemo
		"examples/rlqs/envoy.yaml":                         true, // TestRLQSExampleIsValid
		"examples/ai-gateways/token-policy.yaml":           true, // TestAIGatewayTokenPolicy
		"examples/ai-gateways/quota-policy.yaml":           true, // TestAIGatewayQuotaPolicyExample
	}
	// The Helm chart's templates render only with Helm's engine: the
	// chart's own module (charts/chartcheck) renders every values file
	// and decodes every object strictly into its Kubernetes type.
	chart := func(rel string) bool {
		return rel == "charts/sluice/Chart.yaml" || strings.HasPrefix(rel, "charts/sluice/templates/")
	}
	envoyish := regexp.MustCompile(`(?m)kind:\s*EnvoyFilter|typed_config|static_resources|envoy\.filters\.|apiVersion:`)
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") && !strings.HasSuffix(path, ".json")) {
			return nil
		}
		rel, _ := filepath.Rel("..", path)
		rel = filepath.ToSlash(rel)
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if envoyish.Match(raw) && !checked[rel] && !chart(rel) {
			t.Errorf("%s looks like Envoy or Kubernetes config that no test validates: add it to a test and to this list", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
