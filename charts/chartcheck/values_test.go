package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The chart's copies of files that live elsewhere in the repository are
// the same bytes: examples/config's rules (the default rules), and
// examples/observability's alerts and dashboard (the PrometheusRule and
// the dashboards ConfigMap). Helm reads only files inside the chart, so
// the chart keeps copies; the examples are the truth, and a copy that
// drifts fails here.
func TestChartFilesAreTheExamples(t *testing.T) {
	pairs := map[string]string{
		"files/sluice-alerts.yaml":    "examples/observability/sluice-alerts.yaml",
		"files/sluice-dashboard.json": "examples/observability/sluice-dashboard.json",
	}
	examples, err := filepath.Glob("../../examples/config/*.yaml")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no examples/config/*.yaml: %v", err)
	}
	for _, e := range examples {
		pairs["files/rules/"+filepath.Base(e)] = "examples/config/" + filepath.Base(e)
	}
	copies, err := filepath.Glob(filepath.Join(chartDir, "files/rules/*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range copies {
		if _, ok := pairs["files/rules/"+filepath.Base(c)]; !ok {
			t.Errorf("charts/sluice/files/rules/%s is in no examples/config: remove it", filepath.Base(c))
		}
	}
	for chartFile, example := range pairs {
		want, err := os.ReadFile(filepath.Join("../..", example))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir, chartFile))
		if err != nil {
			t.Errorf("%v: cp %s charts/sluice/%s", err, example, chartFile)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/sluice/%s differs from %s: cp %s charts/sluice/%s", chartFile, example, example, chartFile)
		}
	}
}

// renderInline renders the chart with values written inline as YAML.
func renderInline(t *testing.T, c *chart.Chart, vals string) error {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(vals), &v); err != nil {
		t.Fatalf("%s: %v", vals, err)
	}
	_, err := render(c, v)
	return err
}

// What a user gets wrong in their values fails `helm install` with the
// value named, before anything reaches the cluster.
func TestSchemaRefusesMisspeltAndMistypedValues(t *testing.T) {
	c := loadChart(t)
	cases := []struct {
		name string
		vals string
		want string // in the error
	}{
		{"misspelt top-level key", `backnd: redis`, "backnd"},
		{"misspelt nested key", `redis: {uri: "redis://r:6379"}`, "uri"},
		{"misspelt deep key", `monitoring: {serviceMonitor: {enable: true}}`, "enable"},
		{"misspelt probe key", `probes: {readiness: {period: 5}}`, "period"},
		{"unknown backend", `backend: memcached`, "backend"},
		{"replicas as a string", `replicaCount: "2"`, "replicaCount"},
		{"replicas as a fraction", `replicaCount: 1.5`, "replicaCount"},
		{"bool as a string", `service: {headless: "yes"}`, "headless"},
		{"a flag as a string, not a list", `extraArgs: --pprof`, "extraArgs"},
		{"an extra arg that is no flag", `extraArgs: [pprof]`, "extraArgs"},
		{"a duration in words", `rlqs: {assignmentTTL: 10 seconds}`, "assignmentTTL"},
		{"a pull policy Kubernetes has not", `image: {pullPolicy: Sometimes}`, "pullPolicy"},
		{"a redis URL without a scheme", `redis: {url: "redis.data:6379"}`, "url"},
		{"an xDS server without a port", `rules: {xds: {server: envoy-gateway}}`, "server"},
		{"a rule file not named .yaml", `rules: {files: {edge.json: "{}"}}`, "edge.json"},
		{"a region without its weight", `regions: {all: [{name: us}]}`, "weight"},
		{"a log level serve has not", `logLevel: verbose`, "logLevel"},
		{"a port out of range", `service: {grpcPort: 70000}`, "grpcPort"},
		{"labels that are not strings", `podLabels: {tier: 1}`, "tier"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := renderInline(t, c, tc.vals)
			if err == nil {
				t.Fatalf("%s: rendered", tc.vals)
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v\nwant the schema's refusal naming %q", tc.vals, err, tc.want)
			}
		})
	}
}

// The chart refuses to render what would run but be wrong, saying why.
func TestChartRefusesDeploymentsThatWouldBeWrong(t *testing.T) {
	c := loadChart(t)
	cases := []struct {
		name string
		vals string
		want string
	}{
		{"memory backend, two replicas", `replicaCount: 2`, "each replica keeps its own buckets, so each would enforce the whole limit"},
		{"memory backend, autoscaled", `autoscaling: {enabled: true}`, "each replica the autoscaler adds would enforce the whole limit"},
		{"redis without its address", `backend: redis`, "needs redis.url"},
		{"dynamodb without its table", `backend: dynamodb`, "needs dynamodb.table"},
		{"grace period within the drain", `{terminationGracePeriodSeconds: 15, shutdownTimeoutSeconds: 10, preStopSleepSeconds: 5}`, "must be above preStopSleepSeconds + shutdownTimeoutSeconds"},
		{"sync on the memory backend", `regions: {region: a, all: [{name: a, weight: 1}, {name: b, weight: 1}], sync: {enabled: true, stores: [{name: b, url: "redis://b:6379"}]}}`, "the memory backend has no store"},
		{"sync missing a region's store", `{backend: redis, redis: {url: "redis://a:6379"}, regions: {region: a, all: [{name: a, weight: 1}, {name: b, weight: 1}, {name: c, weight: 1}], sync: {enabled: true, stores: [{name: b, url: "redis://b:6379"}]}}}`, "needs 2"},
		{"a region not among the regions", `regions: {region: us, all: [{name: eu, weight: 1}]}`, "is not one of regions.all"},
		{"a store for this very region", `{backend: redis, redis: {url: "redis://a:6379"}, regions: {region: a, all: [{name: a, weight: 1}, {name: b, weight: 1}], sync: {enabled: true, stores: [{name: a, url: "redis://a:6379"}]}}}`, "must be another region"},
		{"a client certificate without its key", `{backend: redis, redis: {url: "rediss://r:6380", tls: {existingSecret: ca, certKey: tls.crt}}}`, "go together"},
		{"client certificates without the serving Secret", `tls: {clientCA: true}`, "tls.clientCA needs tls.existingSecret"},
		{"both monitors", `monitoring: {serviceMonitor: {enabled: true}, podMonitor: {enabled: true}}`, "scraped twice"},
		{"xds and a rules file", `rules: {files: {a.yaml: "domain: a"}, xds: {enabled: true, server: "eg:18001"}}`, "leave rules.files"},
		{"table hook on redis", `{backend: redis, redis: {url: "redis://r:6379"}, dynamodb: {createTable: {enabled: true}}}`, "needs backend dynamodb"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := renderInline(t, c, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, want an error saying %q", tc.vals, err, tc.want)
			}
		})
	}
	// And what the guards are not about still renders.
	for _, ok := range []string{
		`{backend: redis, redis: {url: "redis://r:6379"}, replicaCount: 2}`,
		`{backend: redis, redis: {url: "redis://r:6379"}, autoscaling: {enabled: true}}`,
		`{terminationGracePeriodSeconds: 16, shutdownTimeoutSeconds: 10, preStopSleepSeconds: 5}`,
	} {
		if err := renderInline(t, c, ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// chartTree reads one of the chart's YAML or JSON files as a generic tree.
func chartTree(t *testing.T, name string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(raw, &tree); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return tree
}

func loadSchema(t *testing.T) map[string]any { return chartTree(t, "values.schema.json") }

// The schema is draft-07, refers to nothing outside itself (Helm would
// try to fetch it), and closes every object whose properties it lists, so
// a misspelt key anywhere is refused.
func TestSchemaIsSelfContainedAndClosed(t *testing.T) {
	schema := loadSchema(t)
	if schema["$schema"] != "http://json-schema.org/draft-07/schema#" {
		t.Errorf("$schema is %v, want draft-07", schema["$schema"])
	}
	objects := 0
	var walk func(path string, node any)
	walk = func(path string, node any) {
		switch n := node.(type) {
		case map[string]any:
			if ref, ok := n["$ref"].(string); ok && !strings.HasPrefix(ref, "#/") {
				t.Errorf("%s: $ref %q is not local", path, ref)
			}
			if props, ok := n["properties"].(map[string]any); ok {
				objects++
				if n["additionalProperties"] != false {
					t.Errorf("%s: lists properties but lets others through", path)
				}
				for k, v := range props {
					walk(path+"."+k, v)
				}
			}
			for _, k := range []string{"items", "additionalProperties", "definitions"} {
				if v, ok := n[k].(map[string]any); ok {
					if k == "definitions" {
						for name, d := range v {
							walk(path+".definitions."+name, d)
						}
					} else {
						walk(path+"."+k, v)
					}
				}
			}
		}
	}
	walk("$", schema)
	if objects < 20 {
		t.Errorf("found %d closed objects; the walk no longer finds them", objects)
	}
}

// valueLeaves lists the values a user sets, as dotted paths, with their
// defaults: values.yaml descended wherever the schema lists properties
// (the chart's own structure), and stopped at what it passes through
// whole (resources, affinity, env).
func valueLeaves(t *testing.T, schema map[string]any) map[string]any {
	t.Helper()
	vals := chartTree(t, "values.yaml")
	leaves := map[string]any{}
	var walk func(prefix string, node map[string]any, vals map[string]any)
	walk = func(prefix string, node map[string]any, vals map[string]any) {
		props, _ := node["properties"].(map[string]any)
		for k, sub := range props {
			if prefix == "" && k == "global" {
				continue // Helm's, not the chart's
			}
			path := prefix + k
			v, ok := vals[k]
			if !ok {
				t.Errorf("values.yaml has no %s, which the schema allows: give it its default", path)
				continue
			}
			subNode, _ := sub.(map[string]any)
			if _, nested := subNode["properties"]; nested {
				m, _ := v.(map[string]any)
				walk(path+".", subNode, m)
				continue
			}
			leaves[path] = v
		}
	}
	walk("", schema, vals)
	return leaves
}

// docDefault is how docs/kubernetes.md writes a default: a string bare,
// anything else as JSON.
func docDefault(v any) string {
	if s, ok := v.(string); ok && s != "" {
		return s
	}
	raw, _ := json.Marshal(v)
	return string(raw)
}

// docs/kubernetes.md's table of values lists every value of values.yaml,
// with its default, and no value the chart does not have.
func TestManualDocumentsEveryValue(t *testing.T) {
	leaves := valueLeaves(t, loadSchema(t))
	raw, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Values\n")
	if !ok {
		t.Fatal("docs/kubernetes.md has no section ## Values")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([A-Za-z0-9.]+)` \\| ([^|]*) \\|")
	literal := regexp.MustCompile("^`([^`]*)`$")
	documented := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		if _, dup := documented[m[1]]; dup {
			t.Errorf("docs/kubernetes.md documents %s twice", m[1])
		}
		documented[m[1]] = strings.TrimSpace(m[2])
	}
	var paths []string
	for p := range leaves {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		def, ok := documented[p]
		if !ok {
			t.Errorf("docs/kubernetes.md does not document %s", p)
			continue
		}
		delete(documented, p)
		v := leaves[p]
		complex := false
		switch x := v.(type) {
		case map[string]any:
			complex = len(x) > 0
		case []any:
			complex = len(x) > 0
		}
		if complex {
			continue // described in words, shown in values.yaml
		}
		m := literal.FindStringSubmatch(def)
		if m == nil || m[1] != docDefault(v) {
			t.Errorf("docs/kubernetes.md gives %s the default %s, values.yaml `%s`", p, def, docDefault(v))
		}
	}
	for p := range documented {
		t.Errorf("docs/kubernetes.md documents %s, which values.yaml does not have", p)
	}
	if len(paths) < 50 {
		t.Errorf("found %d values; the walk no longer finds them", len(paths))
	}
}

// The ci/ values files are the cases TestEveryValuesFileRendersAndHoldsTogether
// renders: together they turn every feature of the issue on at least once.
func TestValuesFilesCoverEveryFeature(t *testing.T) {
	c := loadChart(t)
	seen := map[string]bool{}
	for _, path := range valuesFiles(t) {
		files, err := render(c, readValues(t, path))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		m := decode(t, files)
		for _, o := range m.objects {
			seen[fmt.Sprintf("%T", o)] = true
		}
		d := serverDeployment(t, m)
		args := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
		for _, f := range []string{"--backend=redis", "--backend=dynamodb", "--redis-password-file", "--redis-tls-ca", "--xds-server", "--xds-tls-cert", "--global-regions", "--rlqs-assignment-ttl", "--tls-client-ca", "--memory-max-buckets"} {
			if strings.Contains(args, f) {
				seen[f] = true
			}
		}
		for _, dep := range all[*appsv1.Deployment](m) {
			if dep.Spec.Template.Spec.Containers[0].Args[0] == "sync" {
				seen["sluice sync"] = true
			}
		}
		for _, s := range all[*corev1.Service](m) {
			if s.Spec.ClusterIP == "None" {
				seen["headless"] = true
			}
		}
	}
	for _, want := range []string{
		"*v1.Deployment", "*v1.Service", "*v1.ConfigMap", "*v1.ServiceAccount", "*v1.Pod", "*v1.Job",
		"*v1.PodDisruptionBudget", "*v2.HorizontalPodAutoscaler", "*v1.NetworkPolicy",
		"*v1.ServiceMonitor", "*v1.PodMonitor", "*v1.PrometheusRule",
		"--backend=redis", "--backend=dynamodb", "--redis-password-file", "--redis-tls-ca", "--xds-server", "--xds-tls-cert",
		"--global-regions", "--rlqs-assignment-ttl", "--tls-client-ca", "--memory-max-buckets", "headless", "sluice sync",
	} {
		if !seen[want] {
			t.Errorf("no values file renders %s", want)
		}
	}
}

// Every values example docs/kubernetes.md shows installs: each ```yaml
// block passes the schema and the chart's guards and renders objects that
// decode, and each --set of its commands names a value the chart has.
func TestManualExamplesInstall(t *testing.T) {
	raw, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	c := loadChart(t)
	blocks := regexp.MustCompile("(?ms)^```yaml\n(.*?)^```").FindAllStringSubmatch(string(raw), -1)
	if len(blocks) < 3 {
		t.Fatalf("found %d yaml blocks in docs/kubernetes.md", len(blocks))
	}
	for _, b := range blocks {
		var vals map[string]any
		if err := yaml.Unmarshal([]byte(b[1]), &vals); err != nil {
			t.Fatalf("docs/kubernetes.md: %v\n%s", err, b[1])
		}
		files, err := render(c, vals)
		if err != nil {
			t.Errorf("docs/kubernetes.md's example does not install: %v\n%s", err, b[1])
			continue
		}
		decode(t, files)
	}
	leaves := valueLeaves(t, loadSchema(t))
	sets := regexp.MustCompile(`--set ([A-Za-z0-9.]+)=`).FindAllStringSubmatch(string(raw), -1)
	if len(sets) == 0 {
		t.Fatal("docs/kubernetes.md has no --set; the pattern no longer finds them")
	}
	for _, m := range sets {
		if _, ok := leaves[m[1]]; !ok {
			t.Errorf("docs/kubernetes.md sets %s, which the chart does not have", m[1])
		}
	}
}
