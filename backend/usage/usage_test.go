package usage

import (
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-rl/sluice/regions"
)

func TestCounterTakesWindowsThatAreOver(t *testing.T) {
	c := New(2)
	a, b, x := regions.Key{Entity: "a", Resource: "r"}, regions.Key{Entity: "b", Resource: "r"}, regions.Key{Entity: "x", Resource: "r"}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() { c.Add(a, 7, 0.25) })
	}
	wg.Wait()
	c.Add(b, 7, 0.1)
	c.Add(x, 7, 1) // a third key in a slot of two
	c.Add(a, 7, -5)
	c.Add(a, 5, 3)
	c.Add(a, 8, 1)
	got := c.Take(8)
	if len(got) != 2 || got[0].Slot != 5 || got[1].Slot != 7 {
		t.Fatalf("Take(8) = %v, want slots 5 and 7, oldest first", got)
	}
	if want := map[regions.Key]int64{a: 25, b: 1}; !maps.Equal(got[1].Counts, want) {
		t.Errorf("slot 7: %v, want %v (sums rounded up)", got[1].Counts, want)
	}
	if c.Dropped() != 1 {
		t.Errorf("dropped %d, want the one request past the slot's two keys", c.Dropped())
	}
	if again := c.Take(8); len(again) != 0 {
		t.Errorf("a second Take(8) = %v, want nothing: each window is written once", again)
	}
	if last := c.Take(9); len(last) != 1 || last[0].Counts[a] != 1 {
		t.Errorf("Take(9) = %v, want slot 8", last)
	}
}

func TestEncodeDecode(t *testing.T) {
	counts := map[regions.Key]int64{}
	for i := range 1_000 {
		counts[regions.Key{Entity: strings.Repeat("e", i%50+1) + "\x00\"é" + strconv.Itoa(i), Resource: "r"}] = int64(i)
	}
	chunks := Encode(counts, 4_096)
	if len(chunks) < 2 {
		t.Fatalf("%d chunks of 4 KiB, want several", len(chunks))
	}
	got := map[regions.Key]int64{}
	for _, c := range chunks {
		if len(c) > 4_096 {
			t.Errorf("a chunk of %d bytes, over 4 KiB", len(c))
		}
		if err := Decode(c, got); err != nil {
			t.Fatal(err)
		}
	}
	if !maps.Equal(got, counts) {
		t.Error("the counts did not come back as they went")
	}
	for _, bad := range []string{``, `{}`, `[["a","r"]]`, `[["","r",1]]`, `[["a","r",-1]]`, `[["a","r",1.5]]`, `[["a","r",1],["b"]]`} {
		into := map[regions.Key]int64{{Entity: "a", Resource: "r"}: 1}
		if err := Decode([]byte(bad), into); err == nil || len(into) != 1 || into[regions.Key{Entity: "a", Resource: "r"}] != 1 {
			t.Errorf("Decode(%q): %v, counts %v; want an error and nothing added", bad, err, into)
		}
	}
}
