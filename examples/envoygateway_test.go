package examples

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	egvalidation "github.com/envoyproxy/gateway/api/v1alpha1/validation"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
)

// There is no cluster here either, so the Envoy Gateway example is checked
// the way the API server and Envoy Gateway would read it: every manifest
// decoded strictly into its Go API type (case-sensitive names, unknown and
// duplicate fields refused, as the API server does), the EnvoyGateway
// configuration from the Helm values and from the ConfigMap decoded the
// same way and then defaulted and validated by Envoy Gateway's own code.
// Then the names that tie the files together are compared, and every file,
// resource, header, port and version the README's commands name.

const egDir = "envoy-gateway"

// egManifests are the files of egDir that kubectl applies, with the kinds
// each holds, in order.
var egManifests = map[string][]string{
	"envoy-gateway-config.yaml": {"ConfigMap"},
	"gateway.yaml":              {"Namespace", "GatewayClass", "Gateway"},
	"backend.yaml":              {"Deployment", "Service", "HTTPRoute"},
	"policy.yaml":               {"BackendTrafficPolicy"},
}

// egValues are the Helm values files: values.yaml, and the overlay Helm
// layers over it.
const egValues, egValuesDynamoDB = "values.yaml", "values-dynamodb.yaml"

// egKey names one Kubernetes object.
type egKey struct{ kind, namespace, name string }

func (k egKey) String() string {
	if k.namespace == "" {
		return k.kind + " " + k.name
	}
	return fmt.Sprintf("%s %s/%s", k.kind, k.namespace, k.name)
}

// egExample is examples/envoy-gateway, decoded.
type egExample struct {
	// The EnvoyGateway configuration three ways, each defaulted and
	// validated as Envoy Gateway does when it loads it: the Helm values,
	// the values with the DynamoDB overlay, and the ConfigMap's file.
	helm, helmDynamoDB, fromConfigMap *egv1a1.EnvoyGateway

	configMap  corev1.ConfigMap
	namespace  corev1.Namespace
	class      gwapiv1.GatewayClass
	gateway    gwapiv1.Gateway
	deployment appsv1.Deployment
	service    corev1.Service
	route      gwapiv1.HTTPRoute
	policy     egv1a1.BackendTrafficPolicy

	objects map[egKey]bool // every object the manifests make
}

// strictJSON decodes js into v as the API server decodes a request body:
// field names match case-sensitively, and unknown or repeated fields fail.
func strictJSON(js []byte, v any) error {
	strict, err := kjson.UnmarshalStrict(js, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// yamlToJSON converts one YAML document to JSON. yaml.v3 refuses a key
// given twice in a mapping, as the API server's YAML reader does.
func yamlToJSON(raw []byte) ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// envoyGatewayConfig decodes an EnvoyGateway configuration strictly (Envoy
// Gateway's own decoder is lenient, so a misspelt field would be dropped
// silently there), then sets its defaults and validates it with Envoy
// Gateway's code, as Envoy Gateway does at start and on every change.
func envoyGatewayConfig(js []byte) (*egv1a1.EnvoyGateway, error) {
	eg := &egv1a1.EnvoyGateway{}
	if err := strictJSON(js, eg); err != nil {
		return nil, err
	}
	if eg.APIVersion != egv1a1.GroupVersion.String() || eg.Kind != egv1a1.KindEnvoyGateway {
		return nil, fmt.Errorf("%s %s: Envoy Gateway loads only %s %s", eg.APIVersion, eg.Kind, egv1a1.GroupVersion, egv1a1.KindEnvoyGateway)
	}
	eg.SetEnvoyGatewayDefaults()
	eg.Logging.SetEnvoyGatewayLoggingDefaults()
	if err := egvalidation.ValidateEnvoyGateway(eg); err != nil {
		return nil, fmt.Errorf("Envoy Gateway refuses it: %w", err)
	}
	return eg, nil
}

// mergeValues layers src over dst as Helm layers values files: maps merge
// key by key, anything else (lists too) is replaced.
func mergeValues(dst, src map[string]any) map[string]any {
	out := maps.Clone(dst)
	for k, v := range src {
		sm, sok := v.(map[string]any)
		dm, dok := out[k].(map[string]any)
		if sok && dok {
			out[k] = mergeValues(dm, sm)
		} else {
			out[k] = v
		}
	}
	return out
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(egDir, file))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return v
}

// helmEnvoyGateway is what the chart makes of the values' config.envoyGateway:
// the EnvoyGateway resource the chart writes into envoy-gateway-config,
// with the apiVersion and kind the chart's template adds.
func helmEnvoyGateway(what string, values map[string]any) (*egv1a1.EnvoyGateway, error) {
	// The chart has no values schema, so a misspelt top-level key would be
	// ignored: allow only the one this example means to set.
	if keys := slices.Sorted(maps.Keys(values)); !slices.Equal(keys, []string{"config"}) {
		return nil, fmt.Errorf("%s: top-level keys %v, want only config", what, keys)
	}
	config, _ := values["config"].(map[string]any)
	if keys := slices.Sorted(maps.Keys(config)); !slices.Equal(keys, []string{"envoyGateway"}) {
		return nil, fmt.Errorf("%s: config keys %v, want only envoyGateway", what, keys)
	}
	eg, ok := config["envoyGateway"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: config.envoyGateway is not a mapping", what)
	}
	for _, k := range []string{"apiVersion", "kind"} {
		if _, set := eg[k]; set {
			return nil, fmt.Errorf("%s: config.envoyGateway sets %s, which the chart writes itself: the file would have it twice", what, k)
		}
	}
	eg = maps.Clone(eg)
	eg["apiVersion"], eg["kind"] = egv1a1.GroupVersion.String(), egv1a1.KindEnvoyGateway
	js, err := json.Marshal(eg)
	if err != nil {
		return nil, err
	}
	cfg, err := envoyGatewayConfig(js)
	if err != nil {
		return nil, fmt.Errorf("%s: config.envoyGateway: %w", what, err)
	}
	return cfg, nil
}

func loadEnvoyGatewayExample(t *testing.T) *egExample {
	t.Helper()
	e := &egExample{objects: map[egKey]bool{}}

	values := readValues(t, egValues)
	var err error
	if e.helm, err = helmEnvoyGateway(egValues, values); err != nil {
		t.Fatal(err)
	}
	overlay := mergeValues(values, readValues(t, egValuesDynamoDB))
	if e.helmDynamoDB, err = helmEnvoyGateway(egValues+" with "+egValuesDynamoDB, overlay); err != nil {
		t.Fatal(err)
	}

	type kind struct {
		apiVersion string
		into       metav1.Object
	}
	kinds := map[string]kind{
		"ConfigMap":            {"v1", &e.configMap},
		"Namespace":            {"v1", &e.namespace},
		"GatewayClass":         {"gateway.networking.k8s.io/v1", &e.class},
		"Gateway":              {"gateway.networking.k8s.io/v1", &e.gateway},
		"Deployment":           {"apps/v1", &e.deployment},
		"Service":              {"v1", &e.service},
		"HTTPRoute":            {"gateway.networking.k8s.io/v1", &e.route},
		"BackendTrafficPolicy": {egv1a1.GroupVersion.String(), &e.policy},
	}
	for _, file := range slices.Sorted(maps.Keys(egManifests)) {
		var got []string
		for _, m := range loadManifests(t, filepath.Join(egDir, file)) {
			got = append(got, m.kind)
			k, ok := kinds[m.kind]
			if !ok {
				t.Fatalf("%s: unexpected kind", m)
			}
			if m.apiVersion != k.apiVersion {
				t.Errorf("%s: apiVersion %q, want %q", m, m.apiVersion, k.apiVersion)
			}
			if err := strictJSON(m.json, k.into); err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			e.objects[egKey{m.kind, k.into.GetNamespace(), k.into.GetName()}] = true
		}
		if want := egManifests[file]; !slices.Equal(got, want) {
			t.Fatalf("%s holds %v, want %v", file, got, want)
		}
	}

	if e.configMap.Name != "envoy-gateway-config" {
		t.Errorf("ConfigMap %s: Envoy Gateway reads envoy-gateway-config", e.configMap.Name)
	}
	if keys := slices.Sorted(maps.Keys(e.configMap.Data)); !slices.Equal(keys, []string{"envoy-gateway.yaml"}) {
		t.Fatalf("ConfigMap %s has keys %v: Envoy Gateway reads envoy-gateway.yaml", e.configMap.Name, keys)
	}
	js, err := yamlToJSON([]byte(e.configMap.Data["envoy-gateway.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap %s: envoy-gateway.yaml: %v", e.configMap.Name, err)
	}
	if e.fromConfigMap, err = envoyGatewayConfig(js); err != nil {
		t.Fatalf("ConfigMap %s: envoy-gateway.yaml: %v", e.configMap.Name, err)
	}
	return e
}

// egNamespace is Envoy Gateway's own namespace: the ConfigMap's, where
// Envoy Gateway also deploys the rate-limit service and the Envoys.
func (e *egExample) egNamespace() string { return e.configMap.Namespace }

// rateLimitDeployment is the rate-limit Deployment as Envoy Gateway fills
// it in before deploying it (the default image where none is set).
func rateLimitDeployment(eg *egv1a1.EnvoyGateway) *egv1a1.KubernetesDeploymentSpec {
	return eg.Provider.GetEnvoyGatewayKubeProvider().RateLimitDeployment
}

// docsEnvoyGateway is the EnvoyGateway configuration docs/envoy-gateway.md
// shows, decoded and validated as the example's.
func docsEnvoyGateway(t *testing.T) *egv1a1.EnvoyGateway {
	t.Helper()
	raw, err := os.ReadFile("../docs/envoy-gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal("docs/envoy-gateway.md shows no YAML configuration")
	}
	js, err := yamlToJSON(m[1])
	if err != nil {
		t.Fatalf("docs/envoy-gateway.md: %v", err)
	}
	eg, err := envoyGatewayConfig(js)
	if err != nil {
		t.Fatalf("docs/envoy-gateway.md: %v", err)
	}
	return eg
}

// egModuleVersion is the version of Envoy Gateway whose API this test
// decodes with: the one go.mod requires.
func egModuleVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/envoyproxy/gateway (v\S+)`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("go.mod does not require github.com/envoyproxy/gateway")
	}
	return string(m[1])
}

func envMap(c *egv1a1.KubernetesContainerSpec) map[string]string {
	env := map[string]string{}
	for _, v := range c.Env {
		env[v.Name] = v.Value
	}
	return env
}

func TestEnvoyGatewayConfig(t *testing.T) {
	e := loadEnvoyGatewayExample(t)
	docImage := ptrString(rateLimitDeployment(docsEnvoyGateway(t)).Container.Image)
	configs := []struct {
		name string
		eg   *egv1a1.EnvoyGateway
	}{
		{egValues, e.helm},
		{egValues + " with " + egValuesDynamoDB, e.helmDynamoDB},
		{"ConfigMap " + e.configMap.Name, e.fromConfigMap},
	}
	flags := readmeServeFlags(t)
	for _, c := range configs {
		// Without rateLimit, Envoy Gateway deploys no rate-limit service.
		if c.eg.RateLimit == nil {
			t.Errorf("%s: no rateLimit: Envoy Gateway would deploy no rate-limit service", c.name)
			continue
		}
		d := rateLimitDeployment(c.eg)
		if got := ptrString(d.Container.Image); got != docImage {
			t.Errorf("%s: rate-limit image %q, want %q, the image docs/envoy-gateway.md names", c.name, got, docImage)
		}
		env := envMap(d.Container)
		for name := range env {
			flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "SLUICE_")), "_", "-")
			if !strings.HasPrefix(name, "SLUICE_") || !flags[flag] {
				t.Errorf("%s: env %s is no flag of sluice serve", c.name, name)
			}
		}
		replicas := int32(1) // Envoy Gateway's default, Kubernetes' too
		if d.Replicas != nil {
			replicas = *d.Replicas
		}
		if replicas > 1 && (env["SLUICE_BACKEND"] != "dynamodb" || env["SLUICE_TABLE"] == "") {
			t.Errorf("%s: %d replicas on backend %q: on the memory backend each replica would count on its own", c.name, replicas, env["SLUICE_BACKEND"])
		}
		if c.eg == e.helmDynamoDB && replicas < 2 {
			t.Errorf("%s: %d replica: the overlay is there to run more than one", c.name, replicas)
		}
	}

	// The ConfigMap is the Helm values written out: the same controller,
	// rate-limit service and backend.
	if h, c := e.helm.Gateway.ControllerName, e.fromConfigMap.Gateway.ControllerName; h != c {
		t.Errorf("controllerName: %q in %s, %q in the ConfigMap", h, egValues, c)
	}
	if !reflect.DeepEqual(e.helm.RateLimit, e.fromConfigMap.RateLimit) {
		t.Errorf("rateLimit differs between %s and the ConfigMap", egValues)
	}
	if h, c := rateLimitDeployment(e.helm), rateLimitDeployment(e.fromConfigMap); !reflect.DeepEqual(h, c) {
		t.Errorf("rateLimitDeployment differs between %s and the ConfigMap", egValues)
	}
	// The ConfigMap replaces install.yaml's, which names Envoy Gateway's
	// own image for the shutdown manager; left out, Envoy Gateway would
	// fall back to its development image.
	version := egModuleVersion(t)
	if got, want := ptrString(e.fromConfigMap.Provider.GetEnvoyGatewayKubeProvider().ShutdownManager.Image), "docker.io/envoyproxy/gateway:"+version; got != want {
		t.Errorf("ConfigMap: shutdown manager image %q, want %q, the release whose API this test checks", got, want)
	}
	if e.egNamespace() != "envoy-gateway-system" {
		t.Errorf("ConfigMap in namespace %q: Envoy Gateway's install uses envoy-gateway-system", e.egNamespace())
	}

	// Every Envoy Gateway version the directory names (Helm --version,
	// install.yaml's release, the shutdown manager's image) is the one
	// whose API this test decodes with; every SLUICE_* variable it names
	// is a flag of sluice serve.
	versionRE := regexp.MustCompile(`--version (\S+)|releases/download/([^/\s]+)/|envoyproxy/gateway:(\S+)|Envoy Gateway (v\d\S*\d)`)
	sluiceVarRE := regexp.MustCompile(`SLUICE_[A-Z0-9_]*[A-Z0-9]`)
	for _, file := range egFiles(t) {
		raw, err := os.ReadFile(filepath.Join(egDir, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range versionRE.FindAllStringSubmatch(string(raw), -1) {
			if v := m[1] + m[2] + m[3] + m[4]; v != version {
				t.Errorf("%s: %q names Envoy Gateway %s, want %s (go.mod)", file, m[0], v, version)
			}
		}
		for _, name := range sluiceVarRE.FindAllString(string(raw), -1) {
			if flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "SLUICE_")), "_", "-"); !flags[flag] {
				t.Errorf("%s: %s is no flag of sluice serve", file, name)
			}
		}
	}
}

func TestEnvoyGatewayDemo(t *testing.T) {
	e := loadEnvoyGatewayExample(t)
	ns := e.namespace.Name
	for _, o := range []metav1.ObjectMeta{e.gateway.ObjectMeta, e.deployment.ObjectMeta, e.service.ObjectMeta, e.route.ObjectMeta, e.policy.ObjectMeta} {
		if o.Namespace != ns {
			t.Errorf("%s is in namespace %q, want %q, the one gateway.yaml makes", o.Name, o.Namespace, ns)
		}
	}

	// The GatewayClass is Envoy Gateway's: its controllerName is the one
	// the configuration gives (or Envoy Gateway's default, which the
	// defaults have filled in).
	for _, eg := range []*egv1a1.EnvoyGateway{e.helm, e.fromConfigMap} {
		if got, want := string(e.class.Spec.ControllerName), eg.Gateway.ControllerName; got != want {
			t.Errorf("GatewayClass %s: controllerName %q, Envoy Gateway's is %q", e.class.Name, got, want)
		}
	}
	if got := string(e.gateway.Spec.GatewayClassName); got != e.class.Name {
		t.Errorf("Gateway %s: gatewayClassName %q, want %q", e.gateway.Name, got, e.class.Name)
	}
	listeners := map[gwapiv1.SectionName]gwapiv1.Listener{}
	for _, l := range e.gateway.Spec.Listeners {
		listeners[l.Name] = l
	}

	// The HTTPRoute hangs off the Gateway, on a listener that admits routes
	// from its namespace.
	r := e.route
	if len(r.Spec.ParentRefs) != 1 {
		t.Fatalf("HTTPRoute %s: %d parentRefs, want 1", r.Name, len(r.Spec.ParentRefs))
	}
	p := r.Spec.ParentRefs[0]
	pNS := r.Namespace
	if p.Namespace != nil {
		pNS = string(*p.Namespace)
	}
	if (p.Group != nil && *p.Group != gwapiv1.GroupName) || (p.Kind != nil && *p.Kind != "Gateway") ||
		string(p.Name) != e.gateway.Name || pNS != e.gateway.Namespace {
		t.Errorf("HTTPRoute %s: parent %s/%s, want Gateway %s/%s", r.Name, pNS, p.Name, e.gateway.Namespace, e.gateway.Name)
	}
	var admitting []gwapiv1.Listener
	for _, l := range e.gateway.Spec.Listeners {
		if p.SectionName != nil && l.Name != *p.SectionName {
			continue
		}
		from := gwapiv1.NamespacesFromSame // the default
		if l.AllowedRoutes != nil && l.AllowedRoutes.Namespaces != nil && l.AllowedRoutes.Namespaces.From != nil {
			from = *l.AllowedRoutes.Namespaces.From
		}
		if (from == gwapiv1.NamespacesFromSame && r.Namespace == e.gateway.Namespace) || from == gwapiv1.NamespacesFromAll {
			if l.Protocol == gwapiv1.HTTPProtocolType {
				admitting = append(admitting, l)
			}
		}
	}
	if len(admitting) == 0 {
		t.Errorf("HTTPRoute %s: no HTTP listener of Gateway %s admits it", r.Name, e.gateway.Name)
	}

	// Its backend is the Service, on a port the Service has, whose target
	// the pods expose; the Service selects those pods.
	pod := e.deployment.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(e.deployment.Spec.Selector)
	if err != nil {
		t.Fatalf("Deployment %s: %v", e.deployment.Name, err)
	}
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Deployment %s: selector %v does not select its pods %v", e.deployment.Name, e.deployment.Spec.Selector.MatchLabels, pod.Labels)
	}
	if len(e.service.Spec.Selector) == 0 || !labels.SelectorFromSet(e.service.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("Service %s: selector %v does not select the pods %v", e.service.Name, e.service.Spec.Selector, pod.Labels)
	}
	var refs int
	for _, rule := range r.Spec.Rules {
		for _, b := range rule.BackendRefs {
			refs++
			if (b.Group != nil && *b.Group != "") || (b.Kind != nil && *b.Kind != "Service") ||
				(b.Namespace != nil && string(*b.Namespace) != r.Namespace) || string(b.Name) != e.service.Name {
				t.Errorf("HTTPRoute %s: backend %s, want Service %s in its namespace", r.Name, b.Name, e.service.Name)
				continue
			}
			if b.Port == nil {
				t.Errorf("HTTPRoute %s: backend %s has no port: a Service backend needs one", r.Name, b.Name)
				continue
			}
			sp := slices.IndexFunc(e.service.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Port == *b.Port })
			if sp < 0 {
				t.Errorf("HTTPRoute %s: port %d, which Service %s does not have", r.Name, *b.Port, e.service.Name)
				continue
			}
			c, cp, ok := podPort(pod.Spec, e.service.Spec.Ports[sp])
			if !ok {
				t.Errorf("Service %s: port %d targets %s, which no container of Deployment %s exposes",
					e.service.Name, *b.Port, e.service.Spec.Ports[sp].TargetPort.String(), e.deployment.Name)
				continue
			}
			// netexec listens where --http-port says, whatever the
			// manifest declares.
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--http-port="); ok && v != strconv.Itoa(int(cp.ContainerPort)) {
					t.Errorf("container %s: listens on %s, the Service sends to %d", c.Name, v, cp.ContainerPort)
				}
			}
		}
	}
	if refs == 0 {
		t.Errorf("HTTPRoute %s has no backend", r.Name)
	}

	e.checkPolicy(t)
}

// podPort finds the container port of the pod the Service port sends to
// (its targetPort, by name or number; the port itself when unset).
func podPort(pod corev1.PodSpec, sp corev1.ServicePort) (corev1.Container, corev1.ContainerPort, bool) {
	tp := sp.TargetPort
	for _, c := range pod.Containers {
		for _, cp := range c.Ports {
			var match bool
			switch {
			case tp.Type == intstr.String:
				match = cp.Name == tp.StrVal
			case tp.IntVal == 0:
				match = cp.ContainerPort == sp.Port
			default:
				match = cp.ContainerPort == tp.IntVal
			}
			if match {
				return c, cp, true
			}
		}
	}
	return corev1.Container{}, corev1.ContainerPort{}, false
}

// checkPolicy holds the BackendTrafficPolicy to what Envoy Gateway's CRD
// accepts and to what the README's walk-through relies on.
func (e *egExample) checkPolicy(t *testing.T) {
	t.Helper()
	pol, r := e.policy, e.route
	s := pol.Spec
	refs := slices.Clone(s.TargetRefs)
	if s.TargetRef != nil {
		refs = append(refs, *s.TargetRef)
	}
	if len(refs) != 1 || len(s.TargetSelectors) != 0 {
		t.Fatalf("BackendTrafficPolicy %s: %d targetRefs and %d selectors, want the HTTPRoute alone", pol.Name, len(refs), len(s.TargetSelectors))
	}
	ref := refs[0]
	// The policy attaches to a route of its own namespace only.
	if ref.Group != gwapiv1.GroupName || ref.Kind != "HTTPRoute" || string(ref.Name) != r.Name || pol.Namespace != r.Namespace {
		t.Errorf("BackendTrafficPolicy %s/%s targets %s %s %s, want HTTPRoute %s/%s", pol.Namespace, pol.Name, ref.Group, ref.Kind, ref.Name, r.Namespace, r.Name)
	}
	rl := s.RateLimit
	if rl == nil || rl.Global == nil || rl.Local != nil || (rl.Type != nil && *rl.Type != egv1a1.GlobalRateLimitType) {
		t.Fatalf("BackendTrafficPolicy %s: want a Global rate limit only, which Envoy Gateway sends to its rate-limit service", pol.Name)
	}
	units := []egv1a1.RateLimitUnit{egv1a1.RateLimitUnitSecond, egv1a1.RateLimitUnitMinute, egv1a1.RateLimitUnitHour,
		egv1a1.RateLimitUnitDay, egv1a1.RateLimitUnitWeek, egv1a1.RateLimitUnitMonth, egv1a1.RateLimitUnitYear}
	var perUser, perRoute []egv1a1.RateLimitValue
	for i, rule := range rl.Global.Rules {
		if !slices.Contains(units, rule.Limit.Unit) || rule.Limit.Requests == 0 {
			t.Errorf("rule %d: limit %d per %q", i, rule.Limit.Requests, rule.Limit.Unit)
		}
		if len(rule.ClientSelectors) == 0 {
			perRoute = append(perRoute, rule.Limit)
			continue
		}
		for _, sel := range rule.ClientSelectors {
			// The CRD's rule: a selector must select on something.
			if len(sel.Headers) == 0 && len(sel.Methods) == 0 && sel.Path == nil && sel.SourceCIDR == nil && len(sel.QueryParams) == 0 {
				t.Errorf("rule %d: a client selector with nothing to select on", i)
			}
			for _, h := range sel.Headers {
				typ := egv1a1.HeaderMatchExact
				if h.Type != nil {
					typ = *h.Type
				}
				switch {
				case typ == egv1a1.HeaderMatchDistinct && h.Value != nil:
					t.Errorf("rule %d: header %s is Distinct and has a value", i, h.Name)
				case typ != egv1a1.HeaderMatchDistinct && h.Value == nil:
					t.Errorf("rule %d: header %s matches %s with no value", i, h.Name, typ)
				}
				if typ == egv1a1.HeaderMatchDistinct && strings.EqualFold(h.Name, egUserHeader) && len(rule.ClientSelectors) == 1 && len(sel.Headers) == 1 {
					perUser = append(perUser, rule.Limit)
				}
			}
		}
	}
	// The walk-through: the fourth request of a user in a minute is 429,
	// and requests without the header are held to the route's limit.
	want := egv1a1.RateLimitValue{Requests: 3, Unit: egv1a1.RateLimitUnitMinute}
	if len(perUser) != 1 || !reflect.DeepEqual(perUser[0], want) {
		t.Errorf("per-user limits %+v, want one of 3 per Minute per distinct %s, as README.md says", perUser, egUserHeader)
	}
	want = egv1a1.RateLimitValue{Requests: 20, Unit: egv1a1.RateLimitUnitMinute}
	if len(perRoute) != 1 || !reflect.DeepEqual(perRoute[0], want) {
		t.Errorf("route-wide limits %+v, want one of 20 per Minute, as README.md says", perRoute)
	}
}

// egUserHeader is the header the per-user rule counts by.
const egUserHeader = "x-user-id"

// egFiles lists egDir.
func egFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(egDir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, d := range entries {
		files = append(files, d.Name())
	}
	return files
}

// TestEveryEnvoyGatewayFileIsChecked keeps the tests above complete: a
// file added to examples/envoy-gateway that no test reads fails here.
func TestEveryEnvoyGatewayFileIsChecked(t *testing.T) {
	checked := slices.Collect(maps.Keys(egManifests))
	checked = append(checked, egValues, egValuesDynamoDB, "README.md")
	slices.Sort(checked)
	if got := egFiles(t); !slices.Equal(got, checked) {
		t.Errorf("examples/envoy-gateway holds %v, the tests read %v", got, checked)
	}
}

// shellWords splits a command line as the shell would for what the README
// needs: words split on blanks, quotes removed, and a new command at each
// |, ;, &, $( or ) outside quotes.
func shellWords(line string) [][]string {
	var cmds [][]string
	var cmd []string
	var word strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			cmd = append(cmd, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func() {
		endWord()
		if len(cmd) > 0 {
			cmds = append(cmds, cmd)
		}
		cmd = nil
	}
	var quote rune
	for i, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				word.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			endWord()
		case c == '|' || c == ';' || c == '&' || c == ')' || c == '(':
			endCmd()
		case c == '$' && i+1 < len(line) && line[i+1] == '(':
			endCmd()
		default:
			word.WriteRune(c)
			inWord = true
		}
	}
	endCmd()
	return cmds
}

// readmeCommands are the commands of README.md: the lines of its sh
// blocks (continuations joined) and its inline code that starts with a
// command, each split into commands and words.
func readmeCommands(text string) [][]string {
	var lines []string
	fence := regexp.MustCompile("(?ms)^[ \t]*```sh\n(.*?)^[ \t]*```")
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		lines = append(lines, strings.Split(strings.ReplaceAll(m[1], "\\\n", " "), "\n")...)
	}
	prose := fence.ReplaceAllString(text, "")
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(prose, -1) {
		if code := strings.Join(strings.Fields(m[1]), " "); regexp.MustCompile(`^(kubectl|helm|curl) `).MatchString(code) {
			lines = append(lines, code)
		}
	}
	var cmds [][]string
	for _, l := range lines {
		for _, c := range shellWords(l) {
			// Drop the shell's own words before the command.
			for len(c) > 0 && (c[0] == "do" || c[0] == "then" || strings.HasSuffix(c[0], "=")) {
				c = c[1:]
			}
			if len(c) > 0 {
				cmds = append(cmds, c)
			}
		}
	}
	return cmds
}

// kubectlKinds are the resource names the README's kubectl commands use.
var kubectlKinds = map[string]string{
	"deploy": "Deployment", "deployment": "Deployment", "svc": "Service", "service": "Service",
	"cm": "ConfigMap", "configmap": "ConfigMap", "ns": "Namespace", "namespace": "Namespace",
	"gatewayclass": "GatewayClass", "gateway": "Gateway", "httproute": "HTTPRoute",
	"backendtrafficpolicy": "BackendTrafficPolicy",
}

// flagsWithValue are the flags of kubectl, helm and curl the README uses
// whose value is the next word.
var flagsWithValue = map[string]bool{
	"-n": true, "--namespace": true, "-f": true, "--filename": true, "-l": true, "--selector": true,
	"-o": true, "--output": true, "-c": true, "--container": true, "--version": true,
	"-H": true, "-w": true, "-X": true,
}

// command is one command line, its flags and its other words.
type command struct {
	line  string
	flags map[string][]string
	args  []string
}

func parseCommand(words []string) command {
	c := command{line: strings.Join(words, " "), flags: map[string][]string{}}
	for i := 1; i < len(words); i++ {
		w := words[i]
		switch {
		case flagsWithValue[w] && i+1 < len(words):
			c.flags[w] = append(c.flags[w], words[i+1])
			i++
		case strings.HasPrefix(w, "-"):
			name, value, _ := strings.Cut(w, "=")
			c.flags[name] = append(c.flags[name], value)
		default:
			c.args = append(c.args, w)
		}
	}
	return c
}

func (c command) flag(short, long string) []string { return append(c.flags[short], c.flags[long]...) }

func TestEnvoyGatewayReadme(t *testing.T) {
	e := loadEnvoyGatewayExample(t)
	raw, err := os.ReadFile(filepath.Join(egDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	egNS := e.egNamespace()
	version := egModuleVersion(t)

	// What the README may name besides the manifests' objects: Envoy
	// Gateway's own Deployment (the chart's and install.yaml's name) and
	// the rate-limit Deployment it makes (its fixed name, envoy-ratelimit),
	// with the ports a port-forward may reach: the metrics port Envoy
	// Gateway gives Sluice in PROMETHEUS_ADDR.
	objects := maps.Clone(e.objects)
	objects[egKey{"Deployment", egNS, "envoy-gateway"}] = true
	objects[egKey{"Deployment", egNS, "envoy-ratelimit"}] = true
	remotePorts := map[egKey][]int{{"Deployment", egNS, "envoy-ratelimit"}: {19001}}
	// The Service of the Gateway's Envoy has a name Envoy Gateway makes up;
	// the README finds it by the labels Envoy Gateway gives it, and
	// forwards to a listener's port.
	envoyService := egKey{"Service", egNS, "$ENVOY_SERVICE"}
	for _, l := range e.gateway.Spec.Listeners {
		remotePorts[envoyService] = append(remotePorts[envoyService], int(l.Port))
	}
	owning := map[string]string{
		"gateway.envoyproxy.io/owning-gateway-namespace": e.gateway.Namespace,
		"gateway.envoyproxy.io/owning-gateway-name":      e.gateway.Name,
	}

	localPorts := map[string]bool{}
	var curls []command
	var logGreps []string
	seen := map[string]int{}
	for _, words := range readmeCommands(text) {
		c := parseCommand(words)
		seen[words[0]]++
		switch words[0] {
		case "kubectl":
			checkKubectl(t, c, objects, remotePorts, owning, egNS, version, localPorts)
		case "helm":
			checkHelm(t, c, egNS, version)
		case "curl":
			curls = append(curls, c)
		case "grep":
			if len(c.args) > 0 && strings.HasPrefix(c.args[0], "sluice ") {
				logGreps = append(logGreps, c.args[0])
			}
		}
	}
	if seen["kubectl"] < 10 || seen["helm"] < 2 || seen["curl"] < 4 {
		t.Fatalf("found %v commands in README.md: the patterns no longer find them", seen)
	}
	for _, c := range curls {
		for _, h := range c.flags["-H"] {
			name, _, _ := strings.Cut(h, ":")
			if !strings.EqualFold(strings.TrimSpace(name), egUserHeader) {
				t.Errorf("%s: header %s is not the one the policy counts by, %s", c.line, name, egUserHeader)
			}
		}
		for _, a := range c.args {
			host, _, _ := strings.Cut(a, "/")
			if !localPorts[host] {
				t.Errorf("%s: %s is no port the README forwards", c.line, host)
			}
		}
	}

	// Claims of the prose the code decides: the log line, the metric
	// names, the rate-limit domain (Envoy Gateway's: the listener's
	// namespace/gateway/name).
	serve, err := os.ReadFile("../cmd/sluice/serve.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(logGreps) == 0 {
		t.Error("README.md greps no log line of Sluice")
	}
	for _, p := range logGreps {
		if !strings.Contains(string(serve), `log.Info("`+p+`"`) {
			t.Errorf("README.md greps the log for %q, which sluice serve does not log", p)
		}
	}
	metricsDoc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`\b(?:ratelimit_service|sluice)_[a-z0-9_]*[a-z0-9]\b`).FindAllString(text, -1) {
		if !strings.Contains(string(metricsDoc), "`"+name+"`") {
			t.Errorf("README.md names metric %s, which docs/metrics.md does not", name)
		}
	}
	var domains []string
	for _, l := range e.gateway.Spec.Listeners {
		domains = append(domains, fmt.Sprintf("`%s/%s/%s`", e.gateway.Namespace, e.gateway.Name, l.Name))
	}
	if !slices.ContainsFunc(domains, func(d string) bool { return strings.Contains(text, d) }) {
		t.Errorf("README.md names none of the rate-limit domains %v", domains)
	}
	if !strings.Contains(text, "](../../docs/envoy-gateway.md)") {
		t.Error("README.md does not link docs/envoy-gateway.md")
	}
}

func checkKubectl(t *testing.T, c command, objects map[egKey]bool, remotePorts map[egKey][]int, owning map[string]string, egNS, version string, localPorts map[string]bool) {
	t.Helper()
	if len(c.args) == 0 {
		t.Errorf("%s: no verb", c.line)
		return
	}
	verb, args := c.args[0], c.args[1:]
	if verb == "rollout" && len(args) > 0 {
		args = args[1:] // status, restart
	}
	ns := "default"
	if n := c.flag("-n", "--namespace"); len(n) > 0 {
		ns = n[len(n)-1]
	}
	for _, f := range c.flag("-f", "--filename") {
		if strings.HasPrefix(f, "https://") {
			if want := fmt.Sprintf("https://github.com/envoyproxy/gateway/releases/download/%s/install.yaml", version); f != want {
				t.Errorf("%s: %s, want Envoy Gateway's release manifest %s", c.line, f, want)
			}
			continue
		}
		dir, file := filepath.Split(f)
		if _, ok := egManifests[file]; !ok || dir != "examples/"+egDir+"/" {
			t.Errorf("%s: %s is none of the manifests of examples/%s", c.line, f, egDir)
		}
	}
	var selector labels.Selector
	for _, l := range c.flag("-l", "--selector") {
		sel, err := labels.Parse(l)
		if err != nil {
			t.Errorf("%s: %v", c.line, err)
			continue
		}
		reqs, _ := sel.Requirements()
		for _, r := range reqs {
			want, ok := owning[r.Key()]
			if !ok || r.Operator() != selection.Equals || r.Values().List()[0] != want {
				t.Errorf("%s: selects %s, want the Gateway's labels %v", c.line, r, owning)
			}
		}
		selector = sel
	}
	var target egKey
	for _, a := range args {
		if kindName, name, ok := strings.Cut(a, "/"); ok {
			kind, known := kubectlKinds[kindName]
			if !known {
				t.Errorf("%s: unknown kind %s", c.line, kindName)
				continue
			}
			key := egKey{kind, ns, name}
			if kind == "GatewayClass" || kind == "Namespace" {
				key.namespace = ""
			}
			target = key
			if strings.HasPrefix(name, "$") {
				// A name the command before looked up, by the labels
				// checked above; only the Gateway's Envoy Service is.
				if key != (egKey{"Service", egNS, "$ENVOY_SERVICE"}) {
					t.Errorf("%s: %s is no name the README looks up", c.line, a)
				}
				continue
			}
			if !objects[key] {
				t.Errorf("%s: %s is made by neither the manifests nor Envoy Gateway", c.line, key)
			}
			continue
		}
		if kind, ok := kubectlKinds[a]; ok && selector != nil {
			if kind != "Service" || ns != egNS {
				t.Errorf("%s: looks for %s in %s by the Gateway's labels; Envoy Gateway labels its Envoy Services in %s", c.line, kind, ns, egNS)
			}
			continue
		}
		if local, remote, ok := strings.Cut(a, ":"); ok && verb == "port-forward" {
			port, err := strconv.Atoi(remote)
			if err != nil || !slices.Contains(remotePorts[target], port) {
				t.Errorf("%s: port %s of %s, want one of %v", c.line, remote, target, remotePorts[target])
			}
			localPorts["localhost:"+local] = true
			continue
		}
		t.Errorf("%s: %q is no kind/name the test understands", c.line, a)
	}
}

func checkHelm(t *testing.T, c command, egNS, version string) {
	t.Helper()
	if len(c.args) == 0 {
		t.Errorf("%s: no verb", c.line)
		return
	}
	if n := c.flag("-n", "--namespace"); len(n) != 1 || n[0] != egNS {
		t.Errorf("%s: namespace %v, want %s, where the ConfigMap and Envoy Gateway's commands are", c.line, n, egNS)
	}
	if c.args[0] == "uninstall" {
		return
	}
	if !slices.Contains(c.args, "oci://docker.io/envoyproxy/gateway-helm") {
		t.Errorf("%s: not Envoy Gateway's chart", c.line)
	}
	if v := c.flags["--version"]; len(v) != 1 || v[0] != version {
		t.Errorf("%s: chart version %v, want %s, whose API this test checks", c.line, v, version)
	}
	// values.yaml sets the image; the DynamoDB file only adds to it, so it
	// must come after.
	var files []string
	for _, f := range c.flag("-f", "--values") {
		dir, file := filepath.Split(f)
		if dir != "examples/"+egDir+"/" || (file != egValues && file != egValuesDynamoDB) {
			t.Errorf("%s: %s is neither values file", c.line, f)
		}
		files = append(files, file)
	}
	if len(files) == 0 || files[0] != egValues {
		t.Errorf("%s: values %v, want %s first", c.line, files, egValues)
	}
}
