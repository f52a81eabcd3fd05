package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// opStore is a fresh store of limits and buckets for the operator
// commands, and the flags that point them at it: a table on DynamoDB
// Local made with `sluice table create`, or a redis-server of its own.
type opStore struct {
	flags []string
	// unnamed are flags that choose the store but do not say where it
	// is, and missing what the commands then say.
	unnamed []string
	missing string
	// serve points serve's options at the store.
	serve func(*serveOptions)
}

func newOpTable(t *testing.T) opStore {
	t.Helper()
	srv := dynamodbtest.Require(t)
	awsEnv(t)
	name, endpoint := dynamodbtest.TableName(t), srv.Endpoint()
	if out, code := sluice(t, "table", "create", "--table", name, "--region", "us-east-1", "--endpoint", endpoint); code != 0 {
		t.Fatalf("table create: exit %d\n%s", code, out)
	}
	return opStore{
		flags:   []string{"--table", name, "--region", "us-east-1", "--endpoint", endpoint},
		missing: "--table (or SLUICE_TABLE) is required",
		serve: func(o *serveOptions) {
			o.backend, o.table, o.region, o.endpoint = "dynamodb", name, "us-east-1", endpoint
			o.leaseHorizon = 0 // the buckets' tokens are checked exactly
		},
	}
}

func newOpRedis(t *testing.T) opStore {
	t.Helper()
	url := redistest.Require(t).URL()
	return opStore{
		flags:   []string{"--backend", "redis", "--redis-url", url},
		unnamed: []string{"--backend", "redis"},
		missing: "--redis-url (or SLUICE_REDIS_URL) is required",
		serve: func(o *serveOptions) {
			o.backend, o.redis.URL = "redis", url
			o.leaseHorizon = 0 // the buckets' tokens are checked exactly
		},
	}
}

// eachStore runs test on a DynamoDB table and on Redis: the commands
// behave the same on both.
func eachStore(t *testing.T, test func(*testing.T, opStore)) {
	t.Run("dynamodb", func(t *testing.T) { test(t, newOpTable(t)) })
	t.Run("redis", func(t *testing.T) { test(t, newOpRedis(t)) })
}

// run runs `sluice GROUP SUB args...` against the store and fails the
// test unless it exits with code.
func (tb opStore) run(t *testing.T, code int, args ...string) string {
	t.Helper()
	full := append(args, tb.flags...)
	out, got := sluice(t, full...)
	if got != code {
		t.Fatalf("sluice %s: exit %d, want %d\n%s", strings.Join(args, " "), got, code, out)
	}
	return out
}

func contains(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: output lacks %q:\n%s", what, w, out)
		}
	}
}

func TestLimitsCommands(t *testing.T) { eachStore(t, testLimitsCommands) }

func testLimitsCommands(t *testing.T, tb opStore) {

	out := tb.run(t, 0, "limits", "set", "--system", "rpm=1000/min")
	contains(t, "set system", out, "set system: rpm=1000/min (expires: never)")
	tb.run(t, 0, "limits", "set", "--resource", "chat", "rpm=20/min:cost=request", "tpm=40000/min:burst=60000")
	tb.run(t, 0, "limits", "set", "--entity", "acme", "rpm=500/min")
	out = tb.run(t, 0, "limits", "set", "--entity", "trial-7", "--resource", "chat", "--sync-window", "1h", "rpm=10/min")
	contains(t, "sync-written", out, "set entity trial-7 resource chat: rpm=10/min (expires: 20")
	// 3 h from the write, printed a moment later: "3h0m0s", or "2h59m59s"
	// when the store took a second to answer.
	if !strings.Contains(out, "(in 3h0m") && !strings.Contains(out, "(in 2h59m5") {
		t.Errorf("sync-written: expiry is not 3 h away:\n%s", out)
	}

	// get walks the levels and marks the one in force.
	out = tb.run(t, 0, "limits", "get", "--entity", "acme", "--resource", "chat")
	contains(t, "get acme/chat", out,
		"entity          entity acme resource chat",
		"entity_default  entity acme resource _default_  rpm=500/min",
		"<- in force",
		"resource        resource chat                   rpm=20/min:cost=request tpm=40000/min:burst=60000")
	var res resolutionOut
	if err := json.Unmarshal([]byte(tb.run(t, 0, "limits", "get", "--entity", "zed", "--resource", "chat", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if res.Level != "resource" || len(res.Limits) != 2 || res.Limits[1] != (limitOut{Name: "tpm", Rate: "40000/min", Burst: 60000, Cost: "hits"}) ||
		len(res.Levels) != 4 || res.Levels[0].Found || !res.Levels[2].InForce || !res.Levels[3].Found || res.Levels[3].InForce {
		t.Errorf("get zed/chat as JSON: %+v", res)
	}

	// Where the table's answer is the system default, the rule files'
	// limits (not in the table) come first, and get says so.
	out = tb.run(t, 0, "limits", "get", "--resource", "search")
	contains(t, "get search", out, "system    system           rpm=1000/min  never  <- in force",
		"the system default applies only where the rule files give the resource no limits")

	// list: one entity, or everything (as YAML for scripts).
	out = tb.run(t, 0, "limits", "list", "--entity", "trial-7")
	contains(t, "list trial-7", out, "entity trial-7 resource chat  rpm=10/min")
	var all []configOut
	if err := yaml.Unmarshal([]byte(tb.run(t, 0, "limits", "list", "-o", "yaml")), &all); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range all {
		got = append(got, fmt.Sprintf("%s %s %s ttl=%v", c.Record.Level, c.Record.Entity, c.Record.Resource, c.TTL != ""))
	}
	want := "system   ttl=false|resource  chat ttl=false|entity_default acme _default_ ttl=false|entity trial-7 chat ttl=true"
	if strings.Join(got, "|") != want {
		t.Errorf("list all:\n got %s\nwant %s", strings.Join(got, "|"), want)
	}

	// delete: the next level takes over.
	tb.run(t, 0, "limits", "delete", "--entity", "acme")
	out = tb.run(t, 0, "limits", "get", "--entity", "acme", "--resource", "chat", "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Level != "resource" {
		t.Errorf("after deleting acme's config: %s", out)
	}
	out = tb.run(t, 1, "limits", "delete", "--entity", "acme")
	contains(t, "delete again", out, "entity acme resource _default_: no such record")
	tb.run(t, 0, "limits", "delete", "--resource", "chat")
	tb.run(t, 0, "limits", "delete", "--system")
	out = tb.run(t, 0, "limits", "get", "--resource", "chat")
	contains(t, "get with nothing left", out, "no level has limits in the table")

	// Usage errors exit 2 and say what is wrong.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"limits", "set", "rpm=1/s"}, "name a record: --system, --resource R, or --entity E [--resource R]"},
		{[]string{"limits", "set", "--system", "--entity", "e", "rpm=1/s"}, "--system takes neither"},
		{[]string{"limits", "set", "--system", "rpm=1/fortnight"}, `unknown unit "fortnight"`},
		{[]string{"limits", "set", "--system", "rpm"}, "want name=rate"},
		{[]string{"limits", "set", "--system"}, "requires at least 1 arg"},
		{[]string{"limits", "set", "--resource", "r", "--sync-window", "1h", "rpm=1/s"}, "only with --entity"},
		{[]string{"limits", "get", "--system", "-o", "xml"}, `--output "xml"`},
		{[]string{"limits", "get", "--system", "--key-prefix", "a/b"}, `key prefix "a/b"`},
		{[]string{"limits", "frob"}, `unknown command "frob"`},
	} {
		out := tb.run(t, 2, c.args...)
		contains(t, strings.Join(c.args, " "), out, c.want)
	}
	out, code := sluice(t, append([]string{"limits", "get", "--system"}, tb.unnamed...)...)
	if code != 2 || !strings.Contains(out, tb.missing) {
		t.Errorf("without saying where the store is: exit %d\n%s", code, out)
	}
	out, code = sluice(t, "limits", "get", "--system", "--backend", "memory")
	if code != 2 || !strings.Contains(out, `--backend "memory": want dynamodb or redis`) {
		t.Errorf("--backend memory: exit %d\n%s", code, out)
	}
}

func TestLimitsApply(t *testing.T) { eachStore(t, testLimitsApply) }

func testLimitsApply(t *testing.T, tb opStore) {
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`
system:
  - {name: rpm, rate: 1000/min}
resources:
  chat:
    - {name: rpm, rate: 20/min, cost: request}
entities:
  acme:
    _default_:
      - {name: rpm, rate: 500/min}
`)
	// A config written by hand is not the manifest's to delete.
	tb.run(t, 0, "limits", "set", "--entity", "vip", "rpm=5000/min")

	out := tb.run(t, 0, "limits", "apply", "-f", file, "--dry-run")
	contains(t, "dry run", out, "+ create  system", "+ create  resource chat", "+ create  entity acme resource _default_  rpm=500/min",
		"3 to change, 0 unchanged (dry run, nothing written)")
	tb.run(t, 1, "limits", "delete", "--system") // the dry run wrote nothing

	out = tb.run(t, 0, "limits", "apply", "-f", file)
	contains(t, "apply", out, "3 to change, 0 unchanged (applied)")
	out = tb.run(t, 0, "limits", "apply", "-f", file)
	contains(t, "apply again", out, "0 to change, 3 unchanged (applied)")

	// Change one, drop one, add one.
	write(`
resources:
  chat:
    - {name: rpm, rate: 30/min, cost: request}
entities:
  acme:
    _default_:
      - {name: rpm, rate: 500/min}
    chat:
      - {name: rpm, rate: 50/min}
`)
	var res applyOut
	if err := json.Unmarshal([]byte(tb.run(t, 0, "limits", "apply", "-f", file, "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, c := range res.Changes {
		steps = append(steps, c.Action+" "+c.Record.Level+" "+c.Record.Entity+" "+c.Record.Resource)
	}
	want := "update resource  chat|unchanged entity_default acme _default_|create entity acme chat|delete system  "
	if strings.Join(steps, "|") != want || !res.Applied || res.DryRun {
		t.Errorf("second manifest:\n got %s (applied %v)\nwant %s", strings.Join(steps, "|"), res.Applied, want)
	}
	out = tb.run(t, 0, "limits", "list")
	contains(t, "after the second manifest", out, "resource chat", "rpm=30/min:cost=request", "entity vip resource _default_", "rpm=5000/min")
	if strings.Contains(out, "system") {
		t.Errorf("the system record the manifest dropped is still there:\n%s", out)
	}

	// A bad manifest names the line and changes nothing; apply without
	// -f is a usage error.
	before := tb.run(t, 0, "limits", "list", "-o", "json")
	write("resources:\n  chat:\n    - {name: rpm, rate: 30/fortnight}\n")
	out = tb.run(t, 1, "limits", "apply", "-f", file)
	contains(t, "bad manifest", out, "limits.yaml:3: resource chat: limit \"rpm\": rate \"30/fortnight\"")
	if after := tb.run(t, 0, "limits", "list", "-o", "json"); after != before {
		t.Errorf("a bad manifest changed the table:\n%s\nbecame\n%s", before, after)
	}
	tb.run(t, 2, "limits", "apply")
}

func TestEntityCommands(t *testing.T) { eachStore(t, testEntityCommands) }

func testEntityCommands(t *testing.T, tb opStore) {
	for _, k := range []string{"key-1", "key-2"} {
		out := tb.run(t, 0, "entity", "set", k, "--parent", "team-a", "--cascade")
		contains(t, "entity set", out, "set entity "+k+": parent team-a, cascade (charged to the parent too)")
	}
	tb.run(t, 0, "entity", "set", "key-3", "--parent", "team-b")
	tb.run(t, 0, "limits", "set", "--entity", "key-1", "--resource", "chat", "rpm=10/min")

	out := tb.run(t, 0, "entity", "get", "key-1")
	contains(t, "entity get", out, "entity key-1: parent team-a, cascade", "chat      rpm=10/min  never")
	var kids []entityOut
	if err := json.Unmarshal([]byte(tb.run(t, 0, "entity", "children", "team-a", "-o", "json")), &kids); err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 || kids[0].Entity != "key-1" || kids[1].Entity != "key-2" || !kids[0].Cascade {
		t.Errorf("children of team-a: %+v", kids)
	}
	tb.run(t, 1, "entity", "get", "nobody")
	tb.run(t, 2, "entity", "set", "key-9", "--cascade")
	tb.run(t, 2, "entity", "set", "a", "--parent", "a")
	tb.run(t, 2, "entity", "get")

	// A parent is not deleted by accident.
	tb.run(t, 0, "limits", "set", "--entity", "team-a", "rpm=100/min")
	out = tb.run(t, 1, "entity", "delete", "team-a")
	contains(t, "delete a parent", out, "entity team-a is the parent of key-1", "--force")
	out = tb.run(t, 0, "entity", "delete", "team-a", "--force")
	contains(t, "delete --force", out, "deleted entity team-a: 1 items")
	out = tb.run(t, 0, "entity", "delete", "key-1")
	contains(t, "delete key-1", out, "deleted entity key-1: 2 items")
	tb.run(t, 1, "entity", "delete", "key-1")
}

// rulesAPI has a rule whose buckets are named by API key, for the chat
// resource.
const rulesAPI = `domain: api
descriptors:
  - key: api_key
    entity: "{api_key}"
    resource: chat
    limits:
      - {name: rpm, rate: 5/min}
`

// The round trip an operator makes: limits from a manifest are in force
// for traffic through the service; raising one entity's limit by hand
// changes its next decision; the bucket shows what happened.
func TestOperatorRoundTrip(t *testing.T) { eachStore(t, testOperatorRoundTrip) }

func testOperatorRoundTrip(t *testing.T, tb opStore) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rulesAPI), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(manifest, []byte("resources:\n  chat:\n    - {name: rpm, rate: 3/min}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tb.run(t, 0, "limits", "apply", "-f", manifest)

	o := testOptions(dir)
	tb.serve(&o)
	o.configCacheTTL = 300 * time.Millisecond
	s, _, _ := startTestServer(t, o)
	check := func(key string) string {
		out, code := sluice(t, "check", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "api", "--descriptor", "api_key="+key)
		if code != 0 {
			t.Fatalf("check: exit %d\n%s", code, out)
		}
		return out
	}
	// The manifest's 3/min beats the rule file's 5/min.
	for i := range 3 {
		if out := check("k1"); !strings.HasPrefix(out, "OK") || !strings.Contains(out, "3/minute (rpm)") {
			t.Fatalf("request %d: %s", i+1, out)
		}
	}
	if out := check("k1"); !strings.HasPrefix(out, "OVER_LIMIT") {
		t.Fatalf("request 4: %s", out)
	}
	out := tb.run(t, 0, "buckets", "get", "--entity", "k1", "--resource", "chat")
	contains(t, "bucket of k1", out, "limits from: resource default: expires after its time to fill x the TTL multiplier",
		"rpm    3/min  3      0", "expires: 20")

	// k1 gets its own, larger limit: the bucket shows it in force and the
	// bucket stale until its next write; after the cache TTL the service
	// decides on it.
	tb.run(t, 0, "limits", "set", "--entity", "k1", "--resource", "chat", "rpm10=10/min")
	out = tb.run(t, 0, "buckets", "get", "--entity", "k1", "--resource", "chat")
	contains(t, "bucket before its next write", out, "limits from: operator-written entity config: never expires", "stale:")
	time.Sleep(2 * o.configCacheTTL)
	if out := check("k1"); !strings.HasPrefix(out, "OK") || !strings.Contains(out, "10/minute (rpm10)") || !strings.Contains(out, " 9 ") {
		t.Fatalf("after raising k1's limit: %s", out)
	}
	var b bucketOut
	if err := json.Unmarshal([]byte(tb.run(t, 0, "buckets", "get", "--entity", "k1", "--resource", "chat", "-o", "json")), &b); err != nil {
		t.Fatal(err)
	}
	if b.Stale || b.TTL != "" || len(b.Limits) != 1 || b.Limits[0].Name != "rpm10" || b.Limits[0].Tokens < 9 || b.Limits[0].Tokens >= 10 {
		t.Errorf("bucket after the write: %+v", b)
	}
	// Other keys keep the resource default.
	if out := check("k2"); !strings.Contains(out, "3/minute (rpm)") {
		t.Errorf("k2: %s", out)
	}
	// A reset makes k2's bucket full again, and says what it held: its
	// next request leaves 2 of 3, where it would have left 1.
	out = tb.run(t, 0, "buckets", "reset", "--entity", "k2", "--resource", "chat")
	contains(t, "buckets reset", out, "reset the bucket of entity k2 for resource chat", "rpm    3/min  3      2")
	if out := check("k2"); !regexp.MustCompile(`3/minute \(rpm\) +2 `).MatchString(out) {
		t.Errorf("k2 after its reset: %s", out)
	}
	tb.run(t, 1, "buckets", "reset", "--entity", "k3", "--resource", "chat")
	tb.run(t, 2, "buckets", "reset", "--entity", "k2")
	out = tb.run(t, 0, "buckets", "list", "--resource", "chat")
	contains(t, "buckets list", out, "ENTITY", "k1", "k2")
	out = tb.run(t, 0, "buckets", "list", "--resource", "chat", "--limit", "1", "-o", "json")
	if strings.Count(out, `"entity"`) != 1 {
		t.Errorf("--limit 1 listed:\n%s", out)
	}
	tb.run(t, 1, "buckets", "get", "--entity", "k3", "--resource", "chat")
	tb.run(t, 2, "buckets", "get", "--entity", "k3")
	tb.run(t, 2, "buckets", "list")

	// Without the resource record the rule file's 5/min comes before a
	// system default; buckets get, which cannot see the rule file, says
	// so and does not call the bucket stale.
	tb.run(t, 0, "limits", "delete", "--resource", "chat")
	tb.run(t, 0, "limits", "set", "--system", "rpm=1000/min")
	time.Sleep(2 * o.configCacheTTL)
	if out := check("k5"); !strings.Contains(out, "5/minute (rpm)") {
		t.Fatalf("k5 after the resource record went: %s", out)
	}
	out = tb.run(t, 0, "buckets", "get", "--entity", "k5", "--resource", "chat")
	contains(t, "bucket on the rule file's limits", out, "limits from: the rule files' limits for the resource if any, else the system default")
	if strings.Contains(out, "stale") {
		t.Errorf("a bucket on the rule file's limits called stale:\n%s", out)
	}
}
