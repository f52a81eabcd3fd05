package chartcheck

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../sluice"
	release   = "sluice"
	namespace = "rate-limit"
)

var update = flag.Bool("update", false, "rewrite testdata/args.json from the rendered chart")

// kinds maps each apiVersion/kind the chart may render to its Go type. A
// kind not here fails the test: the chart would be creating something
// these checks know nothing about.
var kinds = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"v1/Pod":                                  func() any { return &corev1.Pod{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                            func() any { return &batchv1.Job{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":  func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// manifests is one rendering of the chart, every object decoded.
type manifests struct {
	objects []any
	hooks   map[string][]string // "Kind/name" -> the hook events it runs on
	notes   string
}

// loadChart loads charts/sluice as `helm install ./charts/sluice` does.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return c
}

// render renders the chart with vals over its defaults as `helm install`
// would: the values checked against values.schema.json first, then every
// template in strict mode (a missing value is an error, not "").
func render(c *chart.Chart, vals map[string]any) (map[string]string, error) {
	return renderAs(c, release, vals)
}

// clusterVersion is the oldest Kubernetes the chart is rendered for: the
// first with the preStop sleep action on by default.
var clusterVersion = chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

func renderAs(c *chart.Chart, releaseName string, vals map[string]any) (map[string]string, error) {
	// As helm install does before rendering.
	if !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, clusterVersion.String()) {
		return nil, fmt.Errorf("the chart wants Kubernetes %s, not %s", c.Metadata.KubeVersion, clusterVersion)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = clusterVersion
	top, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Engine{Strict: true}.Render(c, top)
	if err != nil {
		return nil, fmt.Errorf("rendering: %w", err)
	}
	return out, nil
}

// decode splits the rendered files and decodes every object strictly into
// its Kubernetes type, as the API server would: an unknown field, a field
// in the wrong case or given twice, or an unknown kind is an error.
func decode(t *testing.T, files map[string]string) manifests {
	t.Helper()
	m := manifests{hooks: map[string][]string{}}
	names := map[string]bool{}
	var paths []string
	for path := range files {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	for _, path := range paths {
		text := files[path]
		if strings.HasSuffix(path, "NOTES.txt") {
			m.notes = text
			continue
		}
		for _, doc := range releaseutil.SplitManifests(text) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			raw, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s: not YAML: %v\n%s", path, err, doc)
			}
			if string(raw) == "null" {
				continue // only comments
			}
			var head struct {
				metav1.TypeMeta `json:",inline"`
				Metadata        metav1.ObjectMeta `json:"metadata"`
			}
			if err := json.Unmarshal(raw, &head); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			newObj, ok := kinds[head.APIVersion+"/"+head.Kind]
			if !ok {
				t.Fatalf("%s: %s %s is a kind these checks do not know", path, head.APIVersion, head.Kind)
			}
			obj := newObj()
			if err := decodeStrict(raw, obj); err != nil {
				t.Fatalf("%s: %s %s does not decode strictly: %v", path, head.Kind, head.Metadata.Name, err)
			}
			id := head.Kind + "/" + head.Metadata.Name
			if names[id] {
				t.Fatalf("%s: %s rendered twice", path, id)
			}
			names[id] = true
			if head.Metadata.Namespace != namespace && head.Kind != "ConfigMap" {
				t.Errorf("%s: %s is in namespace %q, not the release's", path, id, head.Metadata.Namespace)
			}
			if hook := head.Metadata.Annotations["helm.sh/hook"]; hook != "" {
				m.hooks[id] = strings.Split(hook, ",")
				// Hooks are not release objects: without this the next
				// install or upgrade fails on the one left behind.
				if policy := head.Metadata.Annotations["helm.sh/hook-delete-policy"]; !slices.Contains(strings.Split(policy, ","), "before-hook-creation") {
					t.Errorf("%s: hook %s has delete policy %q, without before-hook-creation", path, id, policy)
				}
			}
			m.objects = append(m.objects, obj)
		}
	}
	// Helm's own sorter parses the hook annotations the way install does
	// (which takes NOTES.txt out first).
	manifestFiles := maps.Clone(files)
	for path := range manifestFiles {
		if strings.HasSuffix(path, "NOTES.txt") {
			delete(manifestFiles, path)
		}
	}
	if _, _, err := releaseutil.SortManifests(manifestFiles, nil, releaseutil.InstallOrder); err != nil {
		t.Fatalf("helm would not sort the manifests: %v", err)
	}
	return m
}

// all returns the objects of type T.
func all[T any](m manifests) []T {
	var out []T
	for _, o := range m.objects {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// valuesFiles returns the chart's defaults (as "") and every ci/*.yaml.
func valuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d values files under ci/, want the ten or more the checks are written for", len(files))
	}
	return append([]string{""}, files...)
}

// valuesName names a values file in messages: "defaults" or "ci/NAME.yaml".
func valuesName(path string) string {
	if path == "" {
		return "defaults"
	}
	return filepath.ToSlash(strings.TrimPrefix(path, chartDir+"/"))
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	if path == "" {
		return map[string]any{}
	}
	vals, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// argsFile records every command line the chart renders, for
// cmd/sluice's TestChartArgumentsAreFlags to parse with the real
// commands: cmd/sluice is package main, and this module cannot import it.
const argsFile = "testdata/args.json"

type commandLine struct {
	Source string   `json:"source"` // values file, object, container
	Args   []string `json:"args"`
}

// Every values file renders, decodes strictly and holds together as a
// cluster would need it to.
func TestEveryValuesFileRendersAndHoldsTogether(t *testing.T) {
	c := loadChart(t)
	var lines []commandLine
	for _, path := range valuesFiles(t) {
		name := valuesName(path)
		vals := readValues(t, path)
		files, err := render(c, vals)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		m := decode(t, files)
		t.Run(strings.TrimSuffix(filepath.Base(name), ".yaml"), func(t *testing.T) {
			checkServer(t, m)
			checkSelectorsAndPorts(t, m)
			checkPods(t, m)
			checkRules(t, m, vals)
			checkMonitoring(t, m, vals)
			checkHelmTest(t, m)
			checkNotes(t, m)
		})
		lines = append(lines, commandLines(name, m)...)
	}
	checkArgsFile(t, lines)
}

func checkArgsFile(t *testing.T, lines []commandLine) {
	t.Helper()
	got, err := json.MarshalIndent(lines, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if t.Failed() {
			t.Fatalf("not writing %s from a chart that fails its checks", argsFile)
		}
		if err := os.WriteFile(argsFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatalf("%v (go test -run TestEveryValuesFileRendersAndHoldsTogether -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the chart's command lines changed: rerun with -update, then `go test ./cmd/sluice -run TestChartArgumentsAreFlags` in the repository's root checks them against the real flags, and commit %s", argsFile)
	}
}

func commandLines(source string, m manifests) []commandLine {
	var out []commandLine
	add := func(obj string, spec corev1.PodSpec) {
		for _, c := range spec.Containers {
			out = append(out, commandLine{Source: fmt.Sprintf("%s: %s container %s", source, obj, c.Name), Args: c.Args})
		}
	}
	for _, d := range all[*appsv1.Deployment](m) {
		add("Deployment "+d.Name, d.Spec.Template.Spec)
	}
	for _, j := range all[*batchv1.Job](m) {
		add("Job "+j.Name, j.Spec.Template.Spec)
	}
	for _, p := range all[*corev1.Pod](m) {
		add("Pod "+p.Name, p.Spec)
	}
	return out
}

// serverDeployment is the Deployment running `sluice serve`.
func serverDeployment(t *testing.T, m manifests) *appsv1.Deployment {
	t.Helper()
	for _, d := range all[*appsv1.Deployment](m) {
		if len(d.Spec.Template.Spec.Containers) > 0 && slices.Equal(d.Spec.Template.Spec.Containers[0].Args[:1], []string{"serve"}) {
			return d
		}
	}
	t.Fatal("no Deployment runs sluice serve")
	return nil
}

// A release of another name names its objects after itself, and they
// still find each other: the Service its pods, the autoscaler and budget
// the Deployment, the test the Service.
func TestReleaseNameNamesTheObjects(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct{ release, want string }{
		{"edge", "edge-sluice"},
		{"sluice-eu", "sluice-eu"},
	} {
		files, err := renderAs(c, tc.release, readValues(t, filepath.Join(chartDir, "ci", "hpa-redis.yaml")))
		if err != nil {
			t.Fatalf("%s: %v", tc.release, err)
		}
		m := decode(t, files)
		if d := serverDeployment(t, m); d.Name != tc.want {
			t.Errorf("release %s: Deployment %s, want %s", tc.release, d.Name, tc.want)
		}
		checkSelectorsAndPorts(t, m)
		checkHelmTest(t, m)
		checkNotes(t, m)
	}
}

// Helm's own linter, as `helm lint --strict` runs it with each values
// file: the chart's metadata, its templates and the objects they render
// (names, apiVersions the cluster still serves), and the values against
// the schema. A warning fails too: the chart has no excuse for one.
func TestHelmLint(t *testing.T) {
	for _, path := range valuesFiles(t) {
		linter := lint.AllWithKubeVersion(chartDir, readValues(t, path), namespace, &clusterVersion)
		for _, msg := range linter.Messages {
			if msg.Severity > support.InfoSev {
				t.Errorf("%s: %s", valuesName(path), msg)
			}
		}
	}
}
