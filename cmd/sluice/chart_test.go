package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every command line charts/sluice renders, for every values file of its
// ci/, is one these commands accept: each flag exists and its value
// parses (a duration, a number), and nothing is left over as a stray
// argument. charts/chartcheck renders the chart with Helm and records the
// command lines in the file read here; it fails when the chart and the
// file differ, and this test when the file and the flags do.
func TestChartArgumentsAreFlags(t *testing.T) {
	lines := chartCommandLines(t)
	commands := map[string]bool{}
	for _, l := range lines {
		// A fresh tree for each line: parsing sets the flags' values.
		cmd, rest, err := newRootCommand().Find(l.Args)
		if err != nil || !cmd.Runnable() || cmd.HasSubCommands() {
			t.Errorf("%s: %q names no command: %v", l.Source, l.Args, err)
			continue
		}
		commands[cmd.CommandPath()] = true
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s: %s: %v", l.Source, cmd.CommandPath(), err)
			continue
		}
		if extra := cmd.Flags().Args(); len(extra) > 0 {
			t.Errorf("%s: %s would get the stray arguments %q", l.Source, cmd.CommandPath(), extra)
		}
		for _, a := range rest {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if f := cmd.Flags().Lookup(name); f != nil && f.Deprecated != "" {
				t.Errorf("%s: --%s is deprecated: %s", l.Source, name, f.Deprecated)
			}
		}
	}
	for _, want := range []string{"sluice serve", "sluice sync", "sluice health", "sluice table create"} {
		if !commands[want] {
			t.Errorf("the chart runs no %s; the file has %d command lines", want, len(lines))
		}
	}
}

// chartLine is a command line charts/sluice renders: where (values file,
// object, container) and the container's args.
type chartLine struct {
	Source string   `json:"source"`
	Args   []string `json:"args"`
}

func chartCommandLines(t *testing.T) []chartLine {
	t.Helper()
	raw, err := os.ReadFile("../../charts/chartcheck/testdata/args.json")
	if err != nil {
		t.Fatal(err)
	}
	var lines []chartLine
	if err := json.Unmarshal(raw, &lines); err != nil {
		t.Fatal(err)
	}
	return lines
}

// chartLineOf returns the command line of source.
func chartLineOf(t *testing.T, source string) []string {
	t.Helper()
	for _, l := range chartCommandLines(t) {
		if l.Source == source {
			return l.Args
		}
	}
	t.Fatalf("the chart renders no %q", source)
	return nil
}

// `helm install sluice ./charts/sluice` then `helm test sluice`, without
// a cluster: the server's command line as the chart renders it by
// default starts and becomes ready on the rules the chart mounts (its
// copy of examples/config, which charts/chartcheck holds equal to the
// ConfigMap), the test Pod's `sluice health` passes against it, and
// SIGTERM ends it cleanly. Only the listeners move to loopback ports of
// their own (a later flag wins).
func TestChartDefaultReleaseServesAndPassesHelmTest(t *testing.T) {
	serve := chartLineOf(t, "defaults: Deployment sluice container sluice")
	health := chartLineOf(t, "defaults: Pod sluice-test container health")
	args := append(slices.Clone(serve[1:]),
		"--config-dir=../../charts/sluice/files/rules",
		"--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=")
	p := startServeProcess(t, args...)
	probe := append(slices.Clone(health), "--http-addr="+p.addrs["http"])
	waitUntil(t, 10*time.Second, "the test Pod's sluice health to pass", func() bool {
		_, code := sluiceProcess(t, probe...)
		return code == 0
	})
	if !strings.Contains(p.out.String(), `"level":"INFO"`) {
		t.Errorf("the chart asks for JSON logs; serve wrote:\n%s", p.out.String())
	}
	if log := p.stop(t); strings.Contains(log, `"level":"ERROR"`) {
		t.Errorf("serve logged errors:\n%s", log)
	}
}
