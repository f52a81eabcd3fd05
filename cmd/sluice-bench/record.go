package main

import (
	"fmt"
	"net/url"
	"runtime"
	"time"

	"github.com/sluice-rl/sluice/bench"
)

// record is the JSON of one run.
type record struct {
	Time         time.Time         `json:"time"`
	Config       recordConfig      `json:"config"`
	Round        int               `json:"round,omitempty"`
	Server       string            `json:"server"`
	Requests     uint64            `json:"requests"`
	Errors       uint64            `json:"errors"`
	ErrorsByCode map[string]uint64 `json:"errors_by_code"`
	FirstError   string            `json:"first_error,omitempty"`
	OK           uint64            `json:"ok"`
	OverLimit    uint64            `json:"over_limit"`
	// Open loop only (config.rate > 0): calls due, sent late, dropped.
	Scheduled uint64  `json:"scheduled,omitempty"`
	Late      uint64  `json:"late,omitempty"`
	Dropped   uint64  `json:"dropped,omitempty"`
	Elapsed   float64 `json:"elapsed_seconds"`
	// Throughput counts answered calls, each one decision of one
	// descriptor.
	Throughput float64      `json:"decisions_per_second"`
	P50        float64      `json:"p50_us"`
	P99        float64      `json:"p99_us"`
	P999       float64      `json:"p999_us"`
	Max        float64      `json:"max_us"`
	Metrics    *bench.Usage `json:"metrics"`
	// With -addr: the calls that failed past their deadline; with
	// -series the windows; with -prime the priming calls.
	PastDeadline *uint64        `json:"past_deadline,omitempty"`
	Series       []seriesRecord `json:"series,omitempty"`
	Prime        *primeRecord   `json:"prime,omitempty"`
}

// seriesRecord is one window of -series, flat: seconds from the run's
// first call, the calls answered in it, and with -metrics what the
// backend did between the scrapes at metrics_from and metrics_to (null
// when the scrape closing it failed).
type seriesRecord struct {
	Start        float64 `json:"start"`
	End          float64 `json:"end"`
	Requests     uint64  `json:"calls"`
	OK           uint64  `json:"ok"`
	OverLimit    uint64  `json:"over_limit"`
	Errors       uint64  `json:"errors"`
	PastDeadline uint64  `json:"past_deadline"`
	Late         uint64  `json:"late"`
	Throughput   float64 `json:"decisions_per_second"`
	P50          float64 `json:"p50_us"`
	P99          float64 `json:"p99_us"`
	// The metrics: decisions, the store's calls (DynamoDB API calls or
	// Redis round trips), DynamoDB's writes, and DynamoDB's local
	// answers and lease writes (null where not served).
	Decisions    *float64 `json:"backend_decisions,omitempty"`
	BackendCalls *float64 `json:"backend_calls,omitempty"`
	Writes       *float64 `json:"writes,omitempty"`
	LocalAnswers *float64 `json:"local_answers,omitempty"`
	LeaseWrites  *float64 `json:"lease_writes,omitempty"`
	MetricsFrom  *float64 `json:"metrics_from,omitempty"`
	MetricsTo    *float64 `json:"metrics_to,omitempty"`
	ScrapeError  string   `json:"scrape_error,omitempty"`
}

// primeRecord is -prime's calls: their answers, how long they took, and
// how long before the run's first call they were sent (lead_seconds).
type primeRecord struct {
	Calls     uint64  `json:"calls"`
	OK        uint64  `json:"ok"`
	OverLimit uint64  `json:"over_limit"`
	Took      float64 `json:"took_seconds"`
	Lead      float64 `json:"lead_seconds"`
}

func seriesRecords(ws []bench.Window) []seriesRecord {
	out := make([]seriesRecord, len(ws))
	for i, w := range ws {
		s := seriesRecord{
			Start: w.Start.Seconds(), End: w.End.Seconds(),
			Requests: w.Requests, OK: w.OK, OverLimit: w.OverLimit, Errors: w.Errors,
			PastDeadline: w.PastDeadline, Late: w.Late, Throughput: w.Throughput,
			P50: us(w.P50), P99: us(w.P99),
		}
		if u := w.Usage; u != nil {
			decisions, calls := u.Decisions, u.BackendCalls
			s.Decisions, s.BackendCalls = &decisions, &calls
			if u.Backend != bench.BackendRedis {
				writes := u.Writes
				s.Writes = &writes
			}
			s.LocalAnswers, s.LeaseWrites = u.LocalAnswers, u.LeaseWrites
			mf, mt := w.MetricsFrom.Seconds(), w.MetricsTo.Seconds()
			s.MetricsFrom, s.MetricsTo = &mf, &mt
		}
		if w.ScrapeError != nil {
			s.ScrapeError = w.ScrapeError.Error()
		}
		out[i] = s
	}
	return out
}

// recordConfig is the command line of a record, after defaults.
type recordConfig struct {
	Args           []string `json:"args"`
	Mode           string   `json:"mode"`
	Addrs          []string `json:"addrs,omitempty"`
	MetricsURLs    []string `json:"metrics_urls,omitempty"`
	Domain         string   `json:"domain,omitempty"`
	Descriptor     []string `json:"descriptor,omitempty"`
	OverDescriptor []string `json:"over_descriptor,omitempty"`
	OverLimit      float64  `json:"over_limit"`
	Rounds         int      `json:"rounds,omitempty"`
	Concurrency    int      `json:"concurrency"`
	Rate           float64  `json:"rate"`
	Conns          int      `json:"conns"`
	Duration       string   `json:"duration"`
	Warmup         string   `json:"warmup"`
	Timeout        string   `json:"timeout"`
	Requests       int64    `json:"requests"`
	Series         string   `json:"series,omitempty"`
	Prime          bool     `json:"prime,omitempty"`
	Fresh          bool     `json:"fresh,omitempty"`
	Keys           int      `json:"keys"`
	Dist           string   `json:"dist"`
	Hot            float64  `json:"hot"`
	ZipfS          float64  `json:"zipf_s"`
	GOOS           string   `json:"goos"`
	GOARCH         string   `json:"goarch"`
	GOMAXPROCS     int      `json:"gomaxprocs"`
	NumCPU         int      `json:"num_cpu"`
	GoVersion      string   `json:"go_version"`
	// Compare mode's Redis side: "redis-server" (-redis) or the URL,
	// and the delay added to its round trips.
	Redis         string `json:"redis,omitempty"`
	RedisDelay    string `json:"redis_delay,omitempty"`
	RedisCoalesce *bool  `json:"redis_coalesce,omitempty"`
}

// record writes the JSON record of one run, with -json.
func (o options) record(out output, start time.Time, round int, server string, r bench.Result) error {
	if out.json == nil {
		return nil
	}
	c := recordConfig{
		Args: o.args, Mode: "compare", Addrs: o.addrs, MetricsURLs: o.metrics, Domain: o.domain,
		Descriptor: entries(o.entries), OverDescriptor: entries(o.over), OverLimit: o.overLimit,
		Rounds: o.rounds, Concurrency: o.concurrency, Rate: o.rate, Conns: o.conns,
		Duration: o.duration.String(), Warmup: o.warmup.String(), Timeout: o.timeout.String(),
		Requests: o.requests, Keys: o.keys, Dist: o.dist.String(), Hot: o.hot, ZipfS: o.zipfS,
		Prime: o.prime, Fresh: o.fresh,
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GOMAXPROCS: runtime.GOMAXPROCS(0),
		NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(),
	}
	if len(o.addrs) > 0 {
		c.Mode, c.Rounds = "addr", 0
	}
	if o.series > 0 {
		c.Series = o.series.String()
	}
	if o.withRedis() {
		c.Redis, c.RedisDelay, c.RedisCoalesce = "redis-server", o.redisDelay.String(), &o.redisCoalesce
		if o.redisURL != "" {
			c.Redis = redactURL(o.redisURL)
		}
	}
	rec := record{
		Time: start.UTC(), Config: c, Round: round, Server: server,
		Requests: r.Requests, Errors: r.Errors, ErrorsByCode: errorCodes(r),
		OK: r.OK, OverLimit: r.OverLimit, Scheduled: r.Scheduled, Late: r.Late, Dropped: r.Dropped, Elapsed: r.Elapsed.Seconds(), Throughput: r.Throughput,
		P50: us(r.P50), P99: us(r.P99), P999: us(r.P999), Max: us(r.Max),
		Metrics: r.Usage,
	}
	if len(o.addrs) > 0 {
		rec.PastDeadline = &r.PastDeadline
	}
	if len(r.Series) > 0 {
		rec.Series = seriesRecords(r.Series)
	}
	if p := r.Prime; p != nil {
		rec.Prime = &primeRecord{Calls: p.Calls, OK: p.OK, OverLimit: p.OverLimit, Took: p.Took.Seconds(), Lead: p.Lead.Seconds()}
	}
	if r.FirstError != nil {
		rec.FirstError = r.FirstError.Error()
	}
	if err := out.json.Encode(rec); err != nil {
		return fmt.Errorf("json record: %w", err)
	}
	return nil
}

// redactURL hides a URL's password.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func entries(es []bench.Entry) []string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Key + "=" + e.Value
	}
	return s
}
