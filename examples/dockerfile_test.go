package examples

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// No Docker engine runs here, so the Dockerfile is checked for the drift
// that would break a build or a running container: every path it copies
// or builds exists, the final stage is distroless and non-root, the binary
// is static, and the health check calls a subcommand the binary has.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms, users []string
	var healthcheck, build string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			froms = append(froms, fields[1])
		case "USER":
			users = append(users, fields[1])
		case "COPY":
			if !strings.HasPrefix(fields[1], "--from=") {
				for _, src := range fields[1 : len(fields)-1] {
					if _, err := os.Stat(filepath.Join("..", src)); err != nil {
						t.Errorf("COPY %s: %v", src, err)
					}
				}
			}
		case "RUN":
			if strings.Contains(line, "go build") {
				build = line
			}
		case "HEALTHCHECK":
			healthcheck = line
		}
	}
	if len(froms) < 2 || !strings.HasPrefix(froms[len(froms)-1], "gcr.io/distroless/static") {
		t.Errorf("stages %v: want a build stage and a distroless static final stage", froms)
	}
	if len(users) == 0 || !strings.HasPrefix(users[len(users)-1], "nonroot") {
		t.Errorf("final USER %v: want nonroot", users)
	}
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "./cmd/sluice") {
		t.Errorf("build step %q: want a static build of ./cmd/sluice", build)
	}
	if _, err := os.Stat(filepath.Join("..", "cmd", "sluice", "main.go")); err != nil {
		t.Errorf("the package the image builds: %v", err)
	}
	// HEALTHCHECK ... CMD ["/usr/local/bin/sluice", "health"]: the
	// subcommand must exist.
	i := strings.Index(healthcheck, "CMD ")
	if i < 0 {
		t.Fatalf("no HEALTHCHECK CMD in %q", healthcheck)
	}
	var argv []string
	if err := json.Unmarshal([]byte(healthcheck[i+4:]), &argv); err != nil || len(argv) < 2 {
		t.Fatalf("HEALTHCHECK CMD %q: want an exec form array", healthcheck[i+4:])
	}
	src, err := os.ReadFile(filepath.Join("..", "cmd", "sluice", argv[1]+".go"))
	if err != nil || !strings.Contains(string(src), `Use:   "`+argv[1]+`"`) {
		t.Errorf("HEALTHCHECK runs `sluice %s`, which the binary does not have", argv[1])
	}
}
