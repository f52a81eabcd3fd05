package descriptors

import (
	"fmt"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// template is an entity, resource or parent template: literal text with
// {key} placeholders. Each placeholder is resolved at load time to the index
// of the request entry that carries the key (the depth of the level with
// that key), so rendering is a few slice reads.
type template struct {
	text  string
	parts []templatePart
}

type templatePart struct {
	lit   string
	entry int // index of the request entry whose value replaces the part; -1 for literal text
}

// parseTemplate compiles text against the keys of the path from the root to
// the node (pathKeys[i] is the key of level i). A placeholder must name a key
// that appears exactly once on the path: a key at two levels would make the
// template depend on which one the author meant.
func parseTemplate(text string, pathKeys []string) (*template, error) {
	if text == "" {
		return nil, fmt.Errorf("empty template (leave the key out instead)")
	}
	t := &template{text: text}
	rest := text
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			t.parts = append(t.parts, templatePart{lit: rest, entry: -1})
			break
		}
		if rest[open] == '}' {
			return nil, fmt.Errorf("template %q: '}' without '{'", text)
		}
		if open > 0 {
			t.parts = append(t.parts, templatePart{lit: rest[:open], entry: -1})
		}
		rest = rest[open+1:]
		end := strings.IndexAny(rest, "{}")
		if end < 0 || rest[end] == '{' {
			return nil, fmt.Errorf("template %q: '{' without '}'", text)
		}
		key := rest[:end]
		rest = rest[end+1:]
		if key == "" {
			return nil, fmt.Errorf("template %q: empty placeholder {}", text)
		}
		entry, err := entryOfKey(key, pathKeys)
		if err != nil {
			return nil, fmt.Errorf("template %q: %w", text, err)
		}
		t.parts = append(t.parts, templatePart{entry: entry})
	}
	return t, nil
}

func entryOfKey(key string, pathKeys []string) (int, error) {
	found := -1
	for i, k := range pathKeys {
		if k != key {
			continue
		}
		if found >= 0 {
			return 0, fmt.Errorf("key %q is at more than one level of the path (%s): ambiguous", key, strings.Join(pathKeys, " > "))
		}
		found = i
	}
	if found < 0 {
		return 0, fmt.Errorf("key %q is not on the path to this node (%s)", key, strings.Join(pathKeys, " > "))
	}
	return found, nil
}

// render substitutes the raw request values. A template that is a single
// placeholder or plain text does not allocate.
func (t *template) render(entries []*rlv3.RateLimitDescriptor_Entry) string {
	if len(t.parts) == 1 {
		return t.parts[0].text(entries)
	}
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.text(entries))
	}
	return b.String()
}

func (p templatePart) text(entries []*rlv3.RateLimitDescriptor_Entry) string {
	if p.entry < 0 {
		return p.lit
	}
	return entries[p.entry].GetValue()
}
