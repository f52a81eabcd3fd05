package examples

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// The compose demo cannot run here (no Docker engine), so it is loaded
// with compose-go, the library Docker Compose uses, which validates it
// against the Compose specification; then it is checked against what it
// must agree with: the Envoy config it mounts (whose clusters name its
// services), the rules and image it uses, and Sluice's flags.
func TestComposeDemo(t *testing.T) {
	dir, err := filepath.Abs("docker-compose")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "compose.yaml")
	project, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: file}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("sluice-demo", true) })
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	svc := func(name string) types.ServiceConfig {
		t.Helper()
		s, err := project.GetService(name)
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		return s
	}

	// Envoy mounts the repository's envoy.yaml, whose clusters must be
	// services here on the ports they listen on.
	envoy := svc("envoy")
	if !mounts(envoy, filepath.Join(dir, "..", "..", "envoy.yaml"), "/etc/envoy/envoy.yaml") {
		t.Errorf("envoy does not mount envoy.yaml: %+v", envoy.Volumes)
	}
	bs := loadEnvoyBootstrap(t)
	for _, c := range bs.GetStaticResources().GetClusters() {
		for _, ep := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range ep.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				if _, err := project.GetService(sa.GetAddress()); err != nil {
					t.Errorf("envoy.yaml cluster %s sends to %s, which is no service of the demo", c.GetName(), sa.GetAddress())
				}
			}
		}
	}
	if len(envoy.Ports) != 1 || envoy.Ports[0].Target != 10000 {
		t.Errorf("envoy ports %+v: want the listener's 10000 published", envoy.Ports)
	}

	// Sluice: built from the repository, on DynamoDB Local, with the
	// example rules; the table job creates the table it serves from.
	sluice, table := svc("sluice"), svc("sluice-table")
	for _, s := range []types.ServiceConfig{sluice, table} {
		if s.Build == nil {
			t.Fatalf("%s is not built from the repository", s.Name)
		}
		if _, err := os.Stat(filepath.Join(s.Build.Context, "Dockerfile")); err != nil {
			t.Errorf("%s build context: %v", s.Name, err)
		}
		if env(s, "SLUICE_ENDPOINT") != "http://dynamodb:8000" || env(s, "SLUICE_REGION") == "" || env(s, "AWS_ACCESS_KEY_ID") == "" {
			t.Errorf("%s environment %v: want DynamoDB Local, a region and credentials", s.Name, s.Environment)
		}
	}
	if env(sluice, "SLUICE_TABLE") == "" || env(sluice, "SLUICE_TABLE") != env(table, "SLUICE_TABLE") {
		t.Errorf("sluice serves table %q, the job creates %q", env(sluice, "SLUICE_TABLE"), env(table, "SLUICE_TABLE"))
	}
	if !slices.Equal([]string(table.Command), []string{"table", "create"}) ||
		!slices.Equal([]string(sluice.Command), []string{"serve", "--backend", "dynamodb"}) {
		t.Errorf("commands %v and %v", table.Command, sluice.Command)
	}
	if !mounts(sluice, filepath.Join(dir, "..", "config"), env(sluice, "SLUICE_CONFIG_DIR")) {
		t.Errorf("sluice does not mount the example rules at SLUICE_CONFIG_DIR: %+v", sluice.Volumes)
	}
	if d, ok := sluice.DependsOn["sluice-table"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("sluice starts before its table exists: %+v", sluice.DependsOn)
	}
	if d, ok := envoy.DependsOn["sluice"]; !ok || d.Condition != types.ServiceConditionHealthy {
		t.Errorf("envoy does not wait for a healthy sluice: %+v", envoy.DependsOn)
	}
	if !strings.Contains(strings.Join(svc("dynamodb").Command, " "), "-inMemory") {
		t.Errorf("dynamodb command %v", svc("dynamodb").Command)
	}
	if up := svc("upstream"); !strings.Contains(strings.Join(up.Command, " "), ":8080") {
		t.Errorf("upstream does not listen on envoy.yaml's port 8080: %v", up.Command)
	}
}

func mounts(s types.ServiceConfig, source, target string) bool {
	for _, v := range s.Volumes {
		if filepath.Clean(v.Source) == filepath.Clean(source) && v.Target == target {
			if _, err := os.Stat(source); err == nil {
				return true
			}
		}
	}
	return false
}

func env(s types.ServiceConfig, key string) string {
	if v, ok := s.Environment[key]; ok && v != nil {
		return *v
	}
	return ""
}
