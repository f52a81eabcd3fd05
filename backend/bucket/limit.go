package bucket

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	}
	return nil
}

// String renders the limit in the compact syntax ParseLimit reads, e.g.
// "rpm=100/min" or "tpm=100000/min:burst=150000:cost=request".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(l.Name)
	b.WriteByte('=')
	b.WriteString(FormatRate(l.Amount, l.Period))
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
// name=rate[:burst=N][:cost=hits|request][:debt=N], for example
// "rpm=100/min" or "tpm=100000/min:burst=150000:debt=0". The name ends at
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
		default:
			return Limit{}, fmt.Errorf("limit %q: unknown option %q (want burst=N, cost=hits|request or debt=N)", s, p)
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
}

// Limit checks the spec and turns it into a Limit. The burst defaults to
// the rate's amount; cost is "hits" (the default) or "request"; the debt
// defaults to one burst.
func (s Spec) Limit() (Limit, error) {
	if s.Name == "" {
		return Limit{}, errors.New("limit needs a name")
	}
	amount, period, err := ParseRate(s.Rate)
	if err != nil {
		return Limit{}, fmt.Errorf("limit %q: %w", s.Name, err)
	}
	l := Limit{Name: s.Name, Amount: amount, Period: period, Burst: amount}
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
