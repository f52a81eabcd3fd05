package bucket

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket/period"
)

// Milli is the number of millitokens in one token. Every token quantity in
// this package is in millitokens so that fractional refill is never rounded
// away between calls.
const Milli = 1000

// Durations of the units a rate may be written in, in milliseconds. A month
// is 30 days and a year 365 days, as in envoyproxy/ratelimit.
const (
	Second = int64(1000)
	Minute = 60 * Second
	Hour   = 60 * Minute
	Day    = 24 * Hour
	Week   = 7 * Day
	Month  = 30 * Day
	Year   = 365 * Day
)

// Upper bounds that keep every product in this package inside int64. They
// are far above any real rate limit (a trillion tokens, ten years).
const (
	MaxTokens = int64(1) << 40 // whole tokens in an amount or a burst
	MaxPeriod = 10 * Year      // refill period
)

// Limit is one token-bucket limit of a bucket. A bucket (one entity and
// resource) has one or more limits, each with its own refill clock; a
// request passes only when every limit has the tokens it costs.
//
// The zero Limit is not valid: Period must be positive. Amount may be zero
// (a limit that never refills; with a zero Burst it denies everything that
// costs anything).
type Limit struct {
	// Name identifies the limit inside its bucket. It is an arbitrary
	// non-empty string (it may hold '-' or '.'); the storage layer must
	// never put it into an expression verbatim.
	Name string
	// Amount is the refill amount in millitokens per Period (the "rate"
	// and, in stored items, the capacity cp).
	Amount int64
	// Period is the refill period in milliseconds.
	Period int64
	// Burst is the ceiling in millitokens: a full bucket holds Burst.
	Burst int64
	// PerRequest makes every request cost one token, whatever its hits.
	// It lets a rule count requests beside a token budget (rpm + tpm).
	PerRequest bool
	// Debt is how far below zero, in millitokens, a charge of tokens
	// already used (Charge) may take the limit: refill repays it before
	// anything is admitted again. Zero means one Burst, so that a
	// response that used a whole burst more than was left still counts
	// in full; NoDebt (any negative value) keeps the limit at zero or
	// above and drops what a charge takes beyond it. See Floor.
	Debt int64
	// Calendar, when set, makes the limit a budget: Amount tokens for
	// each calendar period of this unit in Zone, given in full at the
	// period's start instead of refilled continuously (budget.go).
	// Burst is then Amount and Period the unit's nominal length (a
	// month of 30 days, as for rates), which only reports use.
	Calendar period.Unit
	// Zone is the time zone a budget's periods follow; nil is UTC. It
	// is a pointer so that Limits stay comparable: limits loaded from
	// one file share it, and a reload that loads it again only makes
	// stores reconcile, which keeps a budget's state (Reconcile).
	Zone *time.Location
}

// IsBudget reports whether l is a budget for a calendar period rather
// than a rate.
func (l Limit) IsBudget() bool { return l.Calendar != period.None }

// ZoneName is the name of a budget's time zone ("UTC" when none).
func (l Limit) ZoneName() string {
	if l.Zone == nil {
		return "UTC"
	}
	return l.Zone.String()
}

// NoDebt is the Debt of a limit that never goes below zero.
const NoDebt = int64(-1)

// Floor is how low l and its leases may go together, in millitokens,
// zero or below: the lowest a charge takes them (Limit.Debt). See Bottom.
func Floor(l Limit) int64 {
	switch {
	case l.Debt < 0:
		return 0
	case l.Debt == 0:
		return -l.Burst
	}
	return -l.Debt
}

// Validate reports whether l can be used for decisions.
func (l Limit) Validate() error {
	switch {
	case l.Name == "":
		return errors.New("limit has no name")
	case l.Period <= 0 || l.Period > MaxPeriod:
		return fmt.Errorf("limit %q: period %d ms out of range (1 ms to 10 years)", l.Name, l.Period)
	case l.Amount < 0 || l.Amount > MaxTokens*Milli:
		return fmt.Errorf("limit %q: rate amount out of range (0 to %d tokens)", l.Name, MaxTokens)
	case l.Burst < 0 || l.Burst > MaxTokens*Milli:
		return fmt.Errorf("limit %q: burst out of range (0 to %d tokens)", l.Name, MaxTokens)
	case l.Debt > MaxTokens*Milli:
		return fmt.Errorf("limit %q: debt out of range (0 to %d tokens)", l.Name, MaxTokens)
	case l.IsBudget() && l.Burst != l.Amount:
		return fmt.Errorf("limit %q: a budget for a %s has no burst of its own: it holds its amount", l.Name, l.Calendar)
	case l.IsBudget() && l.Debt > l.Burst:
		// A new period repays one budget of debt (budget.go); more
		// could outlast the period after it.
		return fmt.Errorf("limit %q: a budget's debt may be at most the budget", l.Name)
	case l.Calendar > period.Year:
		return fmt.Errorf("limit %q: unknown calendar period %d", l.Name, l.Calendar)
	}
	return nil
}

// String renders the limit in the compact syntax ParseLimit reads, e.g.
// "rpm=100/min" or "tpm=100000/min:burst=150000:cost=request", and a
// budget as "tokens=10000000:period=month:zone=Europe/Berlin".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(l.Name)
	b.WriteByte('=')
	if l.IsBudget() {
		b.WriteString(formatMilli(l.Amount))
		b.WriteString(":period=")
		b.WriteString(l.Calendar.String())
		if l.ZoneName() != "UTC" {
			b.WriteString(":zone=")
			b.WriteString(l.Zone.String())
		}
	} else {
		b.WriteString(FormatRate(l.Amount, l.Period))
	}
	if l.Burst != l.Amount {
		b.WriteString(":burst=")
		b.WriteString(formatMilli(l.Burst))
	}
	if l.PerRequest {
		b.WriteString(":cost=request")
	}
	switch {
	case l.Debt < 0:
		b.WriteString(":debt=0")
	case l.Debt > 0:
		b.WriteString(":debt=")
		b.WriteString(formatMilli(l.Debt))
	}
	return b.String()
}

// ParseLimit reads a limit written in one word, as on a command line:
// name=rate[:burst=N][:cost=hits|request][:debt=N][:period=unit][:zone=Z],
// for example "rpm=100/min", "tpm=100000/min:burst=150000:debt=0" or a
// budget, "tokens=10000000:period=month:zone=Europe/Berlin" (also
// written "tokens=10000000/month:zone=Europe/Berlin"; without a period
// or a zone, 10000000/month is a rate over 30 days). The name ends at
// the first '=', so it cannot hold one; the rest follows Spec.
func ParseLimit(s string) (Limit, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || rest == "" {
		return Limit{}, fmt.Errorf("limit %q: want name=rate[:burst=N][:cost=hits|request][:debt=N], e.g. rpm=100/min", s)
	}
	parts := strings.Split(rest, ":")
	spec := Spec{Name: name, Rate: parts[0]}
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		if seen[k] {
			return Limit{}, fmt.Errorf("limit %q: %s given twice", s, k)
		}
		seen[k] = true
		switch k {
		case "burst", "debt":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return Limit{}, fmt.Errorf("limit %q: %s %q is not a whole number", s, k, v)
			}
			if k == "burst" {
				spec.Burst = &n
			} else {
				spec.Debt = &n
			}
		case "cost":
			spec.Cost = v
		case "period":
			spec.Period = v
		case "zone":
			spec.Zone = v
		default:
			return Limit{}, fmt.Errorf("limit %q: unknown option %q (want burst=N, cost=hits|request, debt=N, period=day|week|month|year or zone=Z)", s, p)
		}
	}
	return spec.Limit()
}

// unitLength is the length in milliseconds of a unit name (lower case).
func unitLength(name string) (int64, bool) {
	switch name {
	case "s", "sec", "second", "seconds":
		return Second, true
	case "m", "min", "minute", "minutes":
		return Minute, true
	case "h", "hour", "hours":
		return Hour, true
	case "d", "day", "days":
		return Day, true
	case "w", "week", "weeks":
		return Week, true
	case "month", "months":
		return Month, true
	case "y", "year", "years":
		return Year, true
	}
	return 0, false
}

// ParseUnit returns the length in milliseconds of a unit name such as
// "second", "MINUTE" or "h". Names are case-insensitive.
func ParseUnit(unit string) (int64, error) {
	ms, ok := unitLength(strings.ToLower(strings.TrimSpace(unit)))
	if !ok {
		return 0, fmt.Errorf("unknown unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	return ms, nil
}

// ParseRate parses a rate written as "N/unit" or "N/Kunit", for example
// "100/min", "5/10s" or "0/second", into millitokens per period and the
// period in milliseconds. N is a whole number of tokens.
func ParseRate(s string) (amount, period int64, err error) {
	num, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, 0, fmt.Errorf("rate %q: want N/unit, e.g. 100/min or 5/10s", s)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 || n > MaxTokens {
		return 0, 0, fmt.Errorf("rate %q: amount must be a whole number from 0 to %d", s, MaxTokens)
	}
	per = strings.TrimSpace(per)
	i := 0
	for i < len(per) && per[i] >= '0' && per[i] <= '9' {
		i++
	}
	mult := int64(1)
	if i > 0 {
		mult, err = strconv.ParseInt(per[:i], 10, 64)
		if err != nil || mult <= 0 {
			return 0, 0, fmt.Errorf("rate %q: period multiplier must be a positive whole number", s)
		}
	}
	unit, err := ParseUnit(per[i:])
	if err != nil {
		return 0, 0, fmt.Errorf("rate %q: %w", s, err)
	}
	if mult > MaxPeriod/unit {
		return 0, 0, fmt.Errorf("rate %q: period longer than 10 years", s)
	}
	return n * Milli, mult * unit, nil
}

// FormatRate renders millitokens per period the way ParseRate reads it,
// choosing the largest unit that divides the period.
func FormatRate(amount, period int64) string {
	units := []struct {
		ms   int64
		name string
	}{{Year, "year"}, {Month, "month"}, {Week, "week"}, {Day, "day"}, {Hour, "hour"}, {Minute, "min"}, {Second, "s"}}
	for _, u := range units {
		if period%u.ms == 0 {
			if period == u.ms {
				return formatMilli(amount) + "/" + u.name
			}
			return formatMilli(amount) + "/" + strconv.FormatInt(period/u.ms, 10) + u.name
		}
	}
	return formatMilli(amount) + "/" + strconv.FormatInt(period, 10) + "ms"
}

func formatMilli(v int64) string {
	if v%Milli == 0 {
		return strconv.FormatInt(v/Milli, 10)
	}
	return strconv.FormatFloat(float64(v)/Milli, 'f', -1, 64)
}

// Spec is a limit as an operator writes it in a YAML file:
// {name: tpm, rate: 100000/min, burst: 150000, cost: hits, debt: 20000}.
type Spec struct {
	Name  string `yaml:"name" json:"name"`
	Rate  string `yaml:"rate" json:"rate"`
	Burst *int64 `yaml:"burst,omitempty" json:"burst,omitempty"`
	Cost  string `yaml:"cost,omitempty" json:"cost,omitempty"`
	// Debt is in whole tokens: how far below zero a charge after the
	// response may take the limit; 0 keeps it at zero or above. Absent:
	// one burst (Limit.Debt).
	Debt *int64 `yaml:"debt,omitempty" json:"debt,omitempty"`
	// Period, when set (day, week, month or year), makes the limit a
	// budget for that calendar period: Rate is then a whole number of
	// tokens, or N/unit with the same unit. Zone is the IANA time zone
	// its periods follow (UTC by default), and needs a Period.
	Period string `yaml:"period,omitempty" json:"period,omitempty"`
	Zone   string `yaml:"zone,omitempty" json:"zone,omitempty"`
}

// Limit checks the spec and turns it into a Limit. The burst defaults to
// the rate's amount; cost is "hits" (the default) or "request"; the debt
// defaults to one burst.
func (s Spec) Limit() (Limit, error) {
	if s.Name == "" {
		return Limit{}, errors.New("limit needs a name")
	}
	cal, zone, rate, err := s.calendar()
	if err != nil {
		return Limit{}, fmt.Errorf("limit %q: %w", s.Name, err)
	}
	amount, per, err := ParseRate(rate)
	if err != nil {
		return Limit{}, fmt.Errorf("limit %q: %w", s.Name, err)
	}
	l := Limit{Name: s.Name, Amount: amount, Period: per, Burst: amount, Calendar: cal, Zone: zone}
	if cal != period.None && s.Burst != nil {
		return Limit{}, fmt.Errorf("limit %q: a budget for a %s takes no burst: it holds its amount, given in full each %s", s.Name, cal, cal)
	}
	if s.Burst != nil {
		if *s.Burst < 0 || *s.Burst > MaxTokens {
			return Limit{}, fmt.Errorf("limit %q: burst must be a whole number of tokens from 0 to %d", s.Name, MaxTokens)
		}
		l.Burst = *s.Burst * Milli
	}
	if s.Debt != nil {
		switch d := *s.Debt; {
		case d < 0 || d > MaxTokens:
			return Limit{}, fmt.Errorf("limit %q: debt must be a whole number of tokens from 0 to %d", s.Name, MaxTokens)
		case d == 0:
			l.Debt = NoDebt
		default:
			l.Debt = d * Milli
		}
	}
	switch s.Cost {
	case "", "hits":
	case "request":
		l.PerRequest = true
	default:
		return Limit{}, fmt.Errorf("limit %q: cost %q: want hits or request", s.Name, s.Cost)
	}
	return l, l.Validate()
}

// calendar reads a budget's period and zone from s, and the rate to
// parse: a budget has a period (its amount alone, or N/unit with the
// period's unit), or a zone and a rate whose unit is a period. It
// returns period.None and s.Rate for a rate. A budget's rate is for the
// one period: "N/2month" and a rate whose unit is not its period are
// refused, and a zone without a period is refused, since it would do
// nothing.
func (s Spec) calendar() (period.Unit, *time.Location, string, error) {
	num, per, hasUnit := strings.Cut(strings.TrimSpace(s.Rate), "/")
	per = strings.ToLower(strings.TrimSpace(per))
	cal := period.None
	if s.Period != "" {
		u, err := period.ParseUnit(s.Period)
		if err != nil {
			return 0, nil, "", err
		}
		cal = u
		if hasUnit && per != u.String() && per != u.String()+"s" {
			return 0, nil, "", fmt.Errorf("rate %q: a budget for a %s is N or N/%s", s.Rate, u, u)
		}
	} else if hasUnit && s.Zone != "" {
		// A zone names the calendar the rate's unit is for.
		u, err := period.ParseUnit(per)
		if err != nil {
			return 0, nil, "", fmt.Errorf("rate %q: a zone is for a budget, whose rate is N/day, N/week, N/month or N/year", s.Rate)
		}
		cal = u
	}
	if cal == period.None {
		if s.Zone != "" {
			return 0, nil, "", fmt.Errorf("zone %q without a period: a zone is for a budget (period: day, week, month or year)", s.Zone)
		}
		return cal, nil, s.Rate, nil
	}
	zone, err := period.LoadZone(s.Zone)
	if err != nil {
		return 0, nil, "", err
	}
	return cal, zone, strings.TrimSpace(num) + "/" + cal.String(), nil
}
