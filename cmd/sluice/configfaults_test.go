package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The config-fault tests run `sluice serve` on the memory backend with its
// rules in a real directory, send calls from a few goroutines the whole
// time, and break the directory under them: invalid YAML, an invalid rule,
// a file truncated by a writer, the directory removed or emptied, a
// ConfigMap swapped to a bad version. Every call must get the answer of the
// last good rules, and each fault must show in the log, in /metrics and in
// /debug/config, until a good version is picked up.
//
// Each good version ("generation") names its one rule gen-N, so every
// answer says which rules decided it, and alternates between a burst of 1
// and of 2 per hour, so the decision shows it too: a fresh value asked
// twice is OK then OVER_LIMIT under an odd generation, OK twice under an
// even one.

const faultsFile = "faults.yaml"

func genRules(n int) string {
	return fmt.Sprintf("domain: faults\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d, name: gen-%d}\n",
		burstOf(n), n)
}

func burstOf(gen int) int { return 2 - gen%2 }

// Broken versions, each with what its error must say.
const (
	badYAML = "domain: faults\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2\n"
	badRule = "domain: faults\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n"
)

const (
	badYAMLError = faultsFile + ":3: invalid YAML"
	badRuleError = faultsFile + `:4: rate_limit.unit: invalid unit "fortnight"`
)

// faultRig is a serving sluice, its rules directory and the traffic
// running against it.
type faultRig struct {
	t      *testing.T
	s      *server
	dir    string
	logs   *syncBuffer
	client rlsv3.RateLimitServiceClient
	gen    int // the last good generation written

	// allowed holds the generations an answer may come from: the one in
	// force, and the next while it is being picked up. A caller reads it
	// before its call, so that a narrowing after the call cannot fault it.
	allowed  atomic.Pointer[[]string]
	answered atomic.Int64 // calls answered, by the traffic goroutines
	stop     chan struct{}
	wg       sync.WaitGroup

	mu       sync.Mutex
	problems []string // what the traffic saw that it must not
	nProblem int
}

// startFaultRig serves the rules of generation 1 from dir (written by
// layout, which must leave them there) and starts the traffic.
func startFaultRig(t *testing.T, dir string, layout func()) *faultRig {
	t.Helper()
	layout()
	r := &faultRig{t: t, dir: dir, logs: &syncBuffer{}, gen: 1, stop: make(chan struct{})}
	r.allow("gen-1")
	ctx, cancel := context.WithCancel(context.Background())
	s, err := startServer(ctx, testOptions(dir), slog.New(slog.NewTextHandler(r.logs, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r.s = s
	done := make(chan error, 1)
	go func() { done <- s.wait(ctx) }()
	r.client = dial(t, s.grpcLn.Addr().String())
	for w := range 3 {
		r.wg.Go(func() { r.traffic(w) })
	}
	t.Cleanup(func() {
		r.stopTraffic()
		cancel()
		<-done
	})
	r.waitAnswered(100) // traffic is flowing before the first fault
	return r
}

func (r *faultRig) allow(gens ...string) { r.allowed.Store(&gens) }

func (r *faultRig) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nProblem++
	if len(r.problems) < 10 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// stopTraffic ends the traffic and reports what it saw that it must not.
func (r *faultRig) stopTraffic() {
	select {
	case <-r.stop:
		return
	default:
	}
	close(r.stop)
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nProblem > 0 {
		r.t.Errorf("%d of %d calls were not answered by the last good rules; the first:\n%s",
			r.nProblem, r.answered.Load(), strings.Join(r.problems, "\n"))
	}
}

// call asks about one value of the user key, and returns the generation
// that answered and the code. Anything but an answer from a rule is a
// problem: an error (UNAVAILABLE, INTERNAL...), or no limit at all, which
// is how a domain or rule that went missing answers.
func (r *faultRig) call(value string) (gen string, code rlsv3.RateLimitResponse_Code, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "faults",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: value}}}}})
	if err != nil {
		r.problem("%s: %v", value, err)
		return "", 0, false
	}
	st := resp.GetStatuses()
	if len(st) != 1 || st[0].GetCurrentLimit() == nil {
		r.problem("%s: answered by no rule: %v", value, resp)
		return "", 0, false
	}
	return st[0].GetCurrentLimit().GetName(), st[0].GetCode(), true
}

// traffic asks about fresh values, each twice, until stopped.
func (r *faultRig) traffic(worker int) {
	for i := 0; ; i++ {
		select {
		case <-r.stop:
			return
		default:
		}
		value := fmt.Sprintf("w%d-%d", worker, i)
		var gens [2]string
		var codes [2]rlsv3.RateLimitResponse_Code
		for j := range 2 {
			allowed := *r.allowed.Load()
			gen, code, ok := r.call(value)
			if !ok {
				time.Sleep(10 * time.Millisecond)
				break
			}
			r.answered.Add(1)
			if !slices.Contains(allowed, gen) {
				r.problem("%s: answered by %s, want one of %v", value, gen, allowed)
			}
			gens[j], codes[j] = gen, code
		}
		// Both calls decided by one generation: its burst shows. (A pair
		// that straddles a reload may go either way.)
		if gens[0] != "" && gens[0] == gens[1] {
			var n int
			fmt.Sscanf(gens[0], "gen-%d", &n)
			want := [2]rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
			if burstOf(n) == 2 {
				want[1] = rlsv3.RateLimitResponse_OK
			}
			if codes != want {
				r.problem("%s: %v under %s, want %v", value, codes, gens[0], want)
			}
		}
		time.Sleep(2 * time.Millisecond) // a steady stream, not a load test
	}
}

func (r *faultRig) waitAnswered(n int64) {
	r.t.Helper()
	target := r.answered.Load() + n
	waitUntil(r.t, 20*time.Second, fmt.Sprintf("%d more answered calls", n), func() bool { return r.answered.Load() >= target })
}

func (r *faultRig) debugConfig() configView {
	r.t.Helper()
	_, body := get(r.t, "http://"+r.s.debugLn.Addr().String()+"/debug/config")
	var v configView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		r.t.Fatalf("/debug/config: %v\n%s", err, body)
	}
	return v
}

// fault does break to the directory and checks that the failure is seen
// everywhere an operator looks, naming want, while the traffic keeps being
// answered by the rules in force.
func (r *faultRig) fault(what, want string, brk func()) {
	r.t.Helper()
	before := r.debugConfig().Reloads
	brk()
	var v configView
	waitUntil(r.t, 10*time.Second, what+" reported on /debug/config", func() bool {
		v = r.debugConfig()
		return v.Reloads.Failed > before.Failed && strings.Contains(v.Reloads.LastError, want)
	})
	if v.Reloads.OK != before.OK || len(v.Rules) != 1 || v.Rules[0].Name != fmt.Sprintf("gen-%d", r.gen) {
		r.t.Errorf("%s: /debug/config after the failure: reloads %+v, rules %+v; want the rules of gen-%d still in force",
			what, v.Reloads, v.Rules, r.gen)
	}
	metrics, raw := scrape(r.t, r.s)
	if got := metrics["sluice_config_reloads_total{result=failed}"]; got < float64(v.Reloads.Failed) {
		r.t.Errorf("%s: sluice_config_reloads_total{result=failed} = %v, want at least %d\n%s", what, got, v.Reloads.Failed, raw)
	}
	logs := r.logs.String()
	quoted := strings.Trim(strconv.Quote(want), `"`) // as the text handler writes it
	if i := strings.LastIndex(logs, `level=ERROR msg="mapping config reload failed, keeping the previous config"`); i < 0 ||
		!strings.Contains(logs[i:], quoted) || !strings.Contains(logs[i:], "dir="+r.dir) {
		r.t.Errorf("%s: no error line naming %q and the directory in the log:\n%s", what, want, logs)
	}
	// The replica stays in Envoy's endpoints: it still has rules to serve.
	if code, body := get(r.t, "http://"+r.s.httpLn.Addr().String()+"/readyz"); code != 200 {
		r.t.Errorf("%s: /readyz %d %s, want 200", what, code, body)
	}
	// The fault stays in place while traffic runs through it.
	r.waitAnswered(200)
}

// recover writes the next good generation with write and waits until calls
// are decided by it; it returns how long that took.
func (r *faultRig) recover(what string, write func(content string)) time.Duration {
	r.t.Helper()
	before := r.debugConfig().Reloads
	next := r.gen + 1
	r.allow(fmt.Sprintf("gen-%d", r.gen), fmt.Sprintf("gen-%d", next))
	start := time.Now()
	write(genRules(next))
	waitUntil(r.t, 10*time.Second, "gen-"+fmt.Sprint(next)+" in force after "+what, func() bool {
		gen, _, _ := r.call(fmt.Sprintf("probe-%d-%d", next, time.Now().UnixNano()))
		return gen == fmt.Sprintf("gen-%d", next)
	})
	took := time.Since(start)
	r.gen = next
	r.allow(fmt.Sprintf("gen-%d", next))
	v := r.debugConfig()
	if v.Reloads.OK != before.OK+1 || v.Reloads.LastError != "" || v.Reloads.Failed != before.Failed {
		r.t.Errorf("%s: reloads %+v after the recovery, before %+v; want one more ok, no new failure, last_error cleared",
			what, v.Reloads, before)
	}
	r.t.Logf("%s: gen-%d in force %v after it was written", what, next, took.Round(time.Millisecond))
	r.waitAnswered(100)
	return took
}

// finish stops the traffic, which reports its problems, and checks that
// no decision on /metrics was for an unknown domain or an unmatched rule.
func (r *faultRig) finish() {
	r.t.Helper()
	r.stopTraffic()
	metrics, raw := scrape(r.t, r.s)
	for k := range metrics {
		if strings.HasPrefix(k, "sluice_decisions_total") && (strings.Contains(k, "code=unmatched") || strings.Contains(k, "_unknown_")) {
			r.t.Errorf("a decision without the rules: %s\n%s", k, raw)
		}
	}
	r.t.Logf("%d calls answered", r.answered.Load())
}

// writeAtomic writes path the way editors and config tools do: a
// temporary file renamed over it.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestConfigFaultsInvalidFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, faultsFile)
	r := startFaultRig(t, dir, func() { writeAtomic(t, path, genRules(1)) })
	write := func(content string) { writeAtomic(t, path, content) }

	r.fault("invalid YAML", badYAMLError, func() { write(badYAML) })
	r.recover("a good file after invalid YAML", write)

	r.fault("an invalid rule", badRuleError, func() { write(badRule) })
	r.recover("a good file after an invalid rule", write)

	// A writer that truncates the file in place and stalls before writing
	// (a shell's "> faults.yaml"): an empty file, not "no rules".
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r.fault("a file truncated to 0 bytes", faultsFile+":1: empty file", func() {})
	r.recover("the truncating writer finishing", func(content string) {
		if _, err := f.WriteString(content); err != nil {
			t.Fatal(err)
		}
	})
	r.finish()
}

func TestConfigFaultsDirectoryRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rules")
	path := filepath.Join(dir, faultsFile)
	mkdir := func() {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removeAll := func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	r := startFaultRig(t, dir, func() { mkdir(); writeAtomic(t, path, genRules(1)) })

	// rm -rf, then the directory comes back with good rules in one go.
	r.fault("the directory removed", "no such file or directory", removeAll)
	took := r.recover("the directory restored", func(content string) {
		tmp := dir + ".new"
		if err := os.Mkdir(tmp, 0o755); err != nil {
			t.Fatal(err)
		}
		writeAtomic(t, filepath.Join(tmp, faultsFile), content)
		if err := os.Rename(tmp, dir); err != nil {
			t.Fatal(err)
		}
	})
	// This bounds how long the reload takes; it does not show that the
	// parent directory's events, rather than the 5 s poll, found it: a
	// poll tick lands anywhere from 0 to 5 s after the restore, so a
	// watcher without events would usually pass too (serve's poll
	// interval cannot be changed from here). The margin over the events'
	// fraction of a second is for a loaded CI machine.
	if took > 4*time.Second {
		t.Errorf("a restored directory took %v to be picked up, want at most 4 s", took)
	}

	// rm -rf, and it comes back empty, then with a bad file, then fixed.
	r.fault("the directory removed again", "no such file or directory", removeAll)
	r.fault("the directory back empty", "no rule files", mkdir)
	r.fault("the directory back with a bad file", badRuleError, func() { writeAtomic(t, path, badRule) })
	r.recover("the bad file fixed", func(content string) { writeAtomic(t, path, content) })

	// Every rule file removed, the directory left in place.
	r.fault("the rule file removed", "no rule files", func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	})
	r.recover("a rule file added back", func(content string) { writeAtomic(t, path, content) })
	r.finish()
}

// configMap is a directory laid out as the kubelet lays out a ConfigMap
// volume: each version in a timestamped directory, "..data" a symlink to
// the current one, and each file a symlink through "..data".
type configMap struct {
	t       *testing.T
	dir     string
	version int
	current string
}

// update swaps the volume to files, in the kubelet's order: write the new
// version, point "..data_tmp" at it, rename that over "..data", add the
// links of new files, remove those of files gone, remove the old version.
func (c *configMap) update(files map[string]string) {
	t := c.t
	c.version++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%09d", c.version, c.version)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if _, err := os.Lstat(filepath.Join(c.dir, name)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(c.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep && !strings.HasPrefix(e.Name(), "..") {
			if err := os.Remove(filepath.Join(c.dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	if c.current != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, c.current)); err != nil {
			t.Fatal(err)
		}
	}
	c.current = ts
}

func TestConfigFaultsConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	cm := &configMap{t: t, dir: dir}
	r := startFaultRig(t, dir, func() { cm.update(map[string]string{faultsFile: genRules(1)}) })
	swap := func(content string) { cm.update(map[string]string{faultsFile: content}) }

	r.fault("a ConfigMap swapped to invalid YAML", badYAMLError, func() { swap(badYAML) })
	r.fault("a ConfigMap swapped to an invalid rule", badRuleError, func() { swap(badRule) })
	r.recover("a ConfigMap swapped to good rules", swap)

	// The rules moved to another key in one update: an edit like any other.
	r.recover("a ConfigMap whose rules moved to another file", func(content string) {
		cm.update(map[string]string{"moved.yaml": content})
	})
	// Every key removed from the ConfigMap.
	r.fault("a ConfigMap emptied", "no rule files", func() { cm.update(map[string]string{}) })
	r.recover("a ConfigMap filled again", swap)
	r.finish()
}
