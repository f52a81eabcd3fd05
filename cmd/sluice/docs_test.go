package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// manual returns the user's manual: the README and the reference files
// of docs/ it links to, one after the other.
func manual(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	var b strings.Builder
	for _, f := range append([]string{"../../README.md"}, files...) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(raw)
		b.WriteByte('\n')
	}
	return b.String()
}

// The manual (README and docs/) has a section for each command, headed
// "## `sluice <command>`", with a table of its flags. Every flag a
// command has must be in its table with the default it really has, and
// every flag the table names must exist.
func TestManualDocumentsEveryFlag(t *testing.T) {
	readme := manual(t)
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

	// section returns the text under the first heading (a section's:
	// level 2 or lower, not a file's title) that names `path`, up to the
	// next heading.
	section := func(path string) (string, bool) {
		m := regexp.MustCompile("(?m)^##+ .*`" + regexp.QuoteMeta(path) + "`.*\n").FindStringIndex(readme)
		if m == nil {
			return "", false
		}
		rest := readme[m[1]:]
		if i := regexp.MustCompile("(?m)^#").FindStringIndex(rest); i != nil {
			rest = rest[:i[0]]
		}
		return rest, true
	}
	tableOf := func(text string) map[string]string {
		documented := map[string]string{}
		for _, m := range row.FindAllStringSubmatch(text, -1) {
			documented[m[1]] = strings.TrimSpace(m[2])
		}
		return documented
	}

	for _, c := range leaves {
		text, ok := section(c.CommandPath())
		if !ok {
			t.Errorf("the manual has no section headed with `%s`", c.CommandPath())
			continue
		}
		documented := tableOf(text)
		// Flags a command inherits from its group are documented once, in
		// the group's section.
		inherited := map[string]string{}
		if p := c.Parent(); p != nil && p.HasParent() {
			if text, ok := section(p.CommandPath()); ok {
				inherited = tableOf(text)
			}
		}
		c.InheritedFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			if _, ok := inherited[f.Name]; !ok {
				t.Errorf("%s --%s (from %s) is not in the manual's table for %s", c.CommandPath(), f.Name, c.Parent().CommandPath(), c.Parent().CommandPath())
			}
		})
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			def, ok := documented[f.Name]
			if !ok {
				t.Errorf("%s --%s is not in the manual's table", c.CommandPath(), f.Name)
				return
			}
			delete(documented, f.Name)
			// A default written as a literal must be the real one; prose
			// ("from the AWS environment", "none") describes an empty one.
			if m := literal.FindStringSubmatch(def); m != nil && m[1] != f.DefValue {
				t.Errorf("%s --%s: the manual says default %s, the flag's is %q", c.CommandPath(), f.Name, def, f.DefValue)
			}
			if literal.FindStringSubmatch(def) == nil && f.DefValue != "" && f.DefValue != "[]" {
				t.Errorf("%s --%s: the manual gives default %q, the flag's is %q", c.CommandPath(), f.Name, def, f.DefValue)
			}
		})
		for name := range documented {
			t.Errorf("the manual documents %s --%s, which does not exist", c.CommandPath(), name)
		}
	}
}

// Every command's --help shows how it is used: an example each.
func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.HasParent() && strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s has no examples in its --help", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand())
}
