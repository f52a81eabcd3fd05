package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// Every command line charts/sluice renders, for every values file of its
// ci/, is one these commands accept: each flag exists and its value
// parses (a duration, a number), and nothing is left over as a stray
// argument. charts/chartcheck renders the chart with Helm and records the
// command lines in the file read here; it fails when the chart and the
// file differ, and this test when the file and the flags do.
func TestChartArgumentsAreFlags(t *testing.T) {
	raw, err := os.ReadFile("../../charts/chartcheck/testdata/args.json")
	if err != nil {
		t.Fatal(err)
	}
	var lines []struct {
		Source string   `json:"source"`
		Args   []string `json:"args"`
	}
	if err := json.Unmarshal(raw, &lines); err != nil {
		t.Fatal(err)
	}
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
