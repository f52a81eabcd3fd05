package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dockerInstruction is one instruction of a Dockerfile: its keyword in
// capitals and the rest of it, continuation lines joined.
type dockerInstruction struct {
	cmd, args string
	line      int
}

// parseDockerfile reads the instructions of a Dockerfile: comments and
// blank lines dropped, lines ending in a backslash joined to the next.
func parseDockerfile(t *testing.T, path string) []dockerInstruction {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []dockerInstruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstruction{strings.ToUpper(cmd), strings.TrimSpace(args), start})
		cur.Reset()
	}
	return out
}

// execForm is the argv of an instruction in exec form (a JSON array).
func execForm(t *testing.T, in dockerInstruction, args string) []string {
	t.Helper()
	var argv []string
	if err := json.Unmarshal([]byte(args), &argv); err != nil || len(argv) == 0 {
		t.Fatalf("Dockerfile:%d: %s %s: want the exec form, a JSON array (distroless has no shell)", in.line, in.cmd, args)
	}
	return argv
}

// The container image as the Dockerfile describes it. No Docker engine
// runs here, so this checks the file, not a built image: what it copies
// from the repository exists, the final stage is a distroless static base, runs as a named non-root user, puts a
// static binary where ENTRYPOINT and HEALTHCHECK look for it, and their
// subcommands exist in this binary; nothing in it turns the debug
// listener outward or pprof on.
func TestDockerfileRunsAsNonRoot(t *testing.T) {
	all := parseDockerfile(t, filepath.Join("..", "..", "Dockerfile"))
	last := -1
	for i, in := range all {
		if in.cmd == "FROM" {
			last = i
		}
	}
	if last < 0 {
		t.Fatal("Dockerfile: no FROM")
	}
	from, final := all[last], all[last+1:]
	base := strings.Fields(from.args)[0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") {
		t.Errorf("Dockerfile:%d: final stage FROM %s, want a gcr.io/distroless/static image", from.line, base)
	}

	var user, entrypoint, healthcheck, cmdArgs []string
	var binary, asRatelimit string
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = append(user, in.args)
		case "ENTRYPOINT":
			entrypoint = execForm(t, in, in.args)
		case "CMD":
			cmdArgs = execForm(t, in, in.args)
		case "HEALTHCHECK":
			_, rest, ok := strings.Cut(in.args, "CMD ")
			if !ok {
				t.Fatalf("Dockerfile:%d: HEALTHCHECK without CMD", in.line)
			}
			healthcheck = execForm(t, in, rest)
		case "COPY":
			if f := strings.Fields(in.args); strings.HasPrefix(in.args, "--from=") && len(f) == 3 && strings.HasSuffix(f[1], "/sluice") {
				if filepath.Base(f[2]) == ratelimitName {
					asRatelimit = f[2]
				} else {
					binary = f[2]
				}
			}
		case "ENV":
			for _, v := range []string{"SLUICE_DEBUG_ADDR", "SLUICE_PPROF", "SLUICE_LOG_LEVEL"} {
				if strings.Contains(in.args, v) {
					t.Errorf("Dockerfile:%d: ENV sets %s; the image keeps serve's safe default", in.line, v)
				}
			}
		}
	}

	// The last USER wins; with none the container runs as root.
	if len(user) == 0 {
		t.Fatal("Dockerfile: the final stage has no USER: the container would run as root")
	}
	u := user[len(user)-1]
	isRoot := func(id string) bool { return id == "" || id == "root" || id == "0" }
	if name, group, hasGroup := strings.Cut(u, ":"); isRoot(name) || hasGroup && isRoot(group) {
		t.Errorf("Dockerfile: USER %s: want a non-root user (and group)", u)
	}

	if binary == "" {
		t.Fatal("Dockerfile: the final stage copies no sluice binary from the build stage")
	}
	// Envoy Gateway starts its rate-limit image's /bin/ratelimit.
	if asRatelimit != "/bin/"+ratelimitName {
		t.Errorf("Dockerfile: the binary is at %q as ratelimit, want /bin/ratelimit (Envoy Gateway's command)", asRatelimit)
	}
	// What any stage copies from the repository exists: a renamed file
	// would break the build no test here runs.
	for _, in := range all {
		if f := strings.Fields(in.args); in.cmd == "COPY" && !strings.HasPrefix(in.args, "--from=") && len(f) >= 2 {
			for _, src := range f[:len(f)-1] {
				if _, err := os.Stat(filepath.Join("..", "..", src)); err != nil {
					t.Errorf("Dockerfile:%d: COPY %s: %v", in.line, src, err)
				}
			}
		}
	}
	// A static base has no libc: the binary must be built without cgo.
	built := false
	for _, in := range all[:last] {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") && strings.Contains(in.args, "./cmd/sluice") {
			built = true
			if !strings.Contains(in.args, "CGO_ENABLED=0") {
				t.Errorf("Dockerfile:%d: the binary is built without CGO_ENABLED=0, and the distroless static base has no libc", in.line)
			}
		}
	}
	if !built {
		t.Error("Dockerfile: no build stage runs go build ./cmd/sluice")
	}

	// ENTRYPOINT + CMD and the HEALTHCHECK run this binary's commands.
	root := newRootCommand()
	for what, argv := range map[string][]string{"ENTRYPOINT+CMD": append(entrypoint, cmdArgs...), "HEALTHCHECK": healthcheck} {
		if len(argv) < 2 || argv[0] != binary {
			t.Errorf("%s %q: want %s and a subcommand", what, argv, binary)
			continue
		}
		if c, _, err := root.Find(argv[1:]); err != nil || c == root {
			t.Errorf("%s %q: sluice has no such command", what, argv)
		}
	}
	if len(healthcheck) < 2 || healthcheck[1] != "health" {
		t.Errorf("HEALTHCHECK %q: want `sluice health`", healthcheck)
	}
	// `sluice health` with its defaults probes the port serve listens on
	// by default, the one the image exposes.
	healthAddr := newHealthCommand().Flags().Lookup("http-addr").DefValue
	httpAddr := newServeCommand().Flags().Lookup("http-addr").DefValue
	_, healthPort, _ := net.SplitHostPort(healthAddr)
	_, httpPort, _ := net.SplitHostPort(httpAddr)
	if healthPort != httpPort {
		t.Errorf("sluice health probes port %s by default, serve's --http-addr is %s", healthPort, httpAddr)
	}
}
