package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The README is the user's manual: each command has a section headed
// "## `sluice <command>`" with a table of its flags. Every flag a command
// has must be in its table with the default it really has, and every flag
// the table names must exist.
func TestREADMEDocumentsEveryFlag(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	row := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| ([^|]*) \\|")
	literal := regexp.MustCompile("^`([^`]*)`$")

	var leaves []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && !c.HasSubCommands() {
			leaves = append(leaves, c)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand())
	if len(leaves) < 4 {
		t.Fatalf("found %d commands", len(leaves))
	}

	for _, c := range leaves {
		heading := "\n## `" + c.CommandPath() + "`\n"
		_, section, ok := strings.Cut(readme, heading)
		if !ok {
			t.Errorf("README.md has no section %q", strings.TrimSpace(heading))
			continue
		}
		section, _, _ = strings.Cut(section, "\n## ")
		documented := map[string]string{}
		for _, m := range row.FindAllStringSubmatch(section, -1) {
			documented[m[1]] = strings.TrimSpace(m[2])
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			def, ok := documented[f.Name]
			if !ok {
				t.Errorf("%s --%s is not in the README's table", c.CommandPath(), f.Name)
				return
			}
			delete(documented, f.Name)
			// A default written as a literal must be the real one; prose
			// ("from the AWS environment", "none") describes an empty one.
			if m := literal.FindStringSubmatch(def); m != nil && m[1] != f.DefValue {
				t.Errorf("%s --%s: README says default %s, the flag's is %q", c.CommandPath(), f.Name, def, f.DefValue)
			}
			if literal.FindStringSubmatch(def) == nil && f.DefValue != "" && f.DefValue != "[]" {
				t.Errorf("%s --%s: README gives default %q, the flag's is %q", c.CommandPath(), f.Name, def, f.DefValue)
			}
		})
		for name := range documented {
			t.Errorf("README.md documents %s --%s, which does not exist", c.CommandPath(), name)
		}
	}
}
