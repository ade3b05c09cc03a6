// Package flagopt holds the daemons' shared command-line value types, so
// verifierd and certd refuse the same mistakes with the same words.
package flagopt

import (
	"errors"
	"flag"
	"time"
)

// positiveDuration is a flag.Value that refuses a zero or negative
// duration: every duration the daemons take is a timeout or a tolerance,
// where zero or less would not mean "none" but "no deadline" (net/http's
// server timeouts), "cut everything now" (a shutdown grace) or "the
// default" (a client timeout, certd's skew), each a silent surprise.
type positiveDuration struct{ d *time.Duration }

func (p positiveDuration) String() string {
	if p.d == nil {
		return ""
	}
	return p.d.String()
}

func (p positiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		// flag wraps this as `invalid value "…" for flag -name: …`.
		return errors.New("want a duration such as 30s or 2m")
	}
	if d <= 0 {
		return errors.New("must be positive")
	}
	*p.d = d
	return nil
}

// PositiveDuration defines a duration flag like fs.DurationVar whose value
// must be above zero; fs.Parse (and fs.Set) fail on any other value with
// an error naming the flag. Its help names the value a duration, as
// fs.DurationVar's does (flag labels any other Value "value" unless the
// usage back-quotes a name).
func PositiveDuration(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(positiveDuration{p}, name, usage+" (a positive `duration`)")
}
