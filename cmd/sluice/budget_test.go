package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An operator sets a budget beside a rate with `limits set`, traffic
// spends it past what is left with a charge after the response, and
// `buckets get` shows the day in Berlin (budgetZone) it is for and what is used and
// left of it, in debt. A zone that does not exist is refused.
func TestBudgetBucket(t *testing.T) { eachStore(t, testBudgetBucket) }

// budgetZone is Europe/Berlin, or Asia/Tokyo within two hours of
// Berlin's midnight: a day budget that reset while the test ran would
// show the wrong day and nothing used.
func budgetZone(t *testing.T) (string, *time.Location) {
	t.Helper()
	for _, name := range []string{"Europe/Berlin", "Asia/Tokyo"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		if h := time.Now().In(loc).Hour(); h >= 2 && h < 22 {
			return name, loc
		}
	}
	t.Fatal("Berlin and Tokyo both within two hours of midnight")
	return "", nil
}

func testBudgetBucket(t *testing.T, tb opStore) {
	zone, loc := budgetZone(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(rulesAPI), 0o644); err != nil {
		t.Fatal(err)
	}
	out := tb.run(t, 2, "limits", "set", "--entity", "acme", "--resource", "chat", "tpd=1000:period=day:zone=Europe/Atlantis")
	contains(t, "a zone that does not exist", out, `time zone "Europe/Atlantis" does not exist`)
	tb.run(t, 0, "limits", "set", "--entity", "acme", "--resource", "chat", "tpd=1000/day:zone="+zone, "rpm=100/min:cost=request")
	out = tb.run(t, 0, "limits", "get", "--entity", "acme", "--resource", "chat")
	contains(t, "limits get", out, "tpd=1000:period=day:zone="+zone)

	o := testOptions(dir)
	tb.serve(&o)
	s, _, _ := startTestServer(t, o)
	check := func(args ...string) string {
		out, code := sluice(t, append([]string{"check", "--grpc-addr", s.grpcLn.Addr().String(), "--domain", "api", "--descriptor", "api_key=acme"}, args...)...)
		if code != 0 && code != 1 {
			t.Fatalf("check: exit %d\n%s", code, out)
		}
		return out
	}
	for i := range 2 {
		if out := check("--hits", "250"); !strings.HasPrefix(out, "OK") {
			t.Fatalf("request %d of 250: %s", i+1, out)
		}
	}
	check("--hits", "600", "--charge")
	if out := check("--hits", "1"); !strings.HasPrefix(out, "OVER_LIMIT") {
		t.Fatalf("a request on a budget in debt: %s", out)
	}
	out = tb.run(t, 0, "buckets", "get", "--entity", "acme", "--resource", "chat")
	contains(t, "buckets get", out, "budget tpd: a day in "+zone, "used 1100, left -100")
	var b bucketOut
	if err := json.Unmarshal([]byte(tb.run(t, 0, "buckets", "get", "--entity", "acme", "--resource", "chat", "-o", "json")), &b); err != nil {
		t.Fatal(err)
	}
	y, m, d := time.Now().In(loc).Date()
	today := time.Date(y, m, d, 0, 0, 0, 0, loc).Format(time.RFC3339)
	for _, l := range b.Limits {
		if l.Name != "tpd" {
			continue
		}
		if l.Period != "day" || l.Zone != zone || l.Budget == nil || l.Budget.Used != 1100 || l.Budget.Left != -100 || l.Budget.Start != today {
			t.Fatalf("the budget as JSON: %+v %+v (today starts %s)", l, l.Budget, today)
		}
		return
	}
	t.Fatalf("no budget in %+v", b)
}
