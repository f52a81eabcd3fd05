package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Every relative link in the repository's Markdown leads somewhere: the
// file exists, and a #fragment names a heading of the Markdown file it
// points into. Moving a section between files breaks links silently on
// GitHub; here it fails the suite. The README links every file of docs/.
func TestLinksResolve(t *testing.T) {
	root := ".."
	docs := map[string]string{} // path from root -> text
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			raw, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			docs[filepath.ToSlash(rel)] = string(raw)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := docs["README.md"]; !ok || len(docs) < 5 {
		t.Fatalf("found %d Markdown files, README.md among them: %v", len(docs), ok)
	}
	anchors := map[string]map[string]bool{}
	for path, text := range docs {
		anchors[path] = headingAnchors(text)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for path, text := range docs {
		for _, m := range link.FindAllStringSubmatch(stripCode(text), -1) {
			target := m[1]
			if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
				continue // a URL
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(path), file))
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					t.Errorf("%s: link %s: no such file", path, target)
					continue
				}
			}
			checked++
			if frag == "" {
				continue
			}
			as, ok := anchors[dest]
			if !ok {
				t.Errorf("%s: link %s: #%s points into %s, which is not Markdown", path, target, frag, dest)
				continue
			}
			if !as[frag] {
				t.Errorf("%s: link %s: %s has no heading #%s", path, target, dest, frag)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d links; the pattern no longer finds them", checked)
	}
	for path := range docs {
		if strings.HasPrefix(path, "docs/") && !strings.Contains(docs["README.md"], "("+path) {
			t.Errorf("README.md does not link %s", path)
		}
	}
}

// stripCode drops fenced code blocks, whose brackets are not links.
func stripCode(text string) string {
	var b strings.Builder
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// headingAnchors returns the fragments GitHub gives the headings of a
// Markdown text: lower case, punctuation but hyphens and underscores
// dropped, spaces to hyphens, a repeated one suffixed -1, -2, ...
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(stripCode(text), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(title, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}
