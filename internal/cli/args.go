package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"
)

// ParseWithArgs is Parse for commands that take positional arguments: flags
// may come before, between or after them ("skip ID --reason TEXT"). It
// returns the positional arguments; "--" ends the flags. A bad flag is
// reported in one line (with where to find help) and returns ErrUsage;
// -h/--help prints the usage and ends the program successfully.
func ParseWithArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	defer fs.SetOutput(out)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			fs.SetOutput(out)
			if errors.Is(err, flag.ErrHelp) {
				fs.Usage()
				os.Exit(0)
			}
			return nil, Usagef(fs, "%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		// flag stops at the first non-flag argument, or after "--".
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// Usagef prints a one-line usage error for fs's command (and where to find
// help) to its output and returns ErrUsage, which exits with code 2.
func Usagef(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(fs.Output(), "%s: %s (see '%s --help')\n", fs.Name(), fmt.Sprintf(format, args...), fs.Name())
	return ErrUsage
}

// Duration is a flag.Value for a non-negative duration that also accepts
// days ("7d", "1d12h") besides time.ParseDuration's units.
type Duration struct{ D time.Duration }

// String implements flag.Value.
func (d *Duration) String() string {
	if d == nil || d.D == 0 {
		return "0s"
	}
	if d.D%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d.D/(24*time.Hour)), 10) + "d"
	}
	return d.D.String()
}

// Set implements flag.Value.
func (d *Duration) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("%s is negative", s)
	}
	d.D = v
	return nil
}

// ParseDuration parses a duration with time.ParseDuration's units plus "d"
// (24 hours) as the leading unit: "30d", "1d12h", "90m".
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	neg := strings.HasPrefix(t, "-")
	t = strings.TrimPrefix(strings.TrimPrefix(t, "-"), "+")
	var days time.Duration
	if i := strings.IndexByte(t, 'd'); i > 0 {
		n, err := strconv.ParseUint(t[:i], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (use e.g. 90s, 15m, 2h, 7d)", s)
		}
		days, t = time.Duration(n)*24*time.Hour, t[i+1:]
	}
	var rest time.Duration
	if t != "" {
		var err error
		if rest, err = time.ParseDuration(t); err != nil || (days > 0 && rest < 0) {
			return 0, fmt.Errorf("invalid duration %q (use e.g. 90s, 15m, 2h, 7d)", s)
		}
	} else if days == 0 {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 90s, 15m, 2h, 7d)", s)
	}
	v := days + rest
	if neg {
		v = -v
	}
	return v, nil
}

// Time is a flag.Value for a point in time, given as RFC 3339
// ("2026-01-02T15:04:05Z"), a date ("2026-01-02", UTC midnight) or a
// duration ago ("90m", "2d": that long before now).
type Time struct{ T time.Time }

// String implements flag.Value.
func (t *Time) String() string {
	if t == nil || t.T.IsZero() {
		return ""
	}
	return t.T.Format(time.RFC3339)
}

// Set implements flag.Value.
func (t *Time) Set(s string) error {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if v, err := time.Parse(layout, s); err == nil {
			t.T = v
			return nil
		}
	}
	if d, err := ParseDuration(s); err == nil {
		if d < 0 {
			return fmt.Errorf("%s is negative (give a duration ago, like 2h, or a time)", s)
		}
		t.T = time.Now().Add(-d)
		return nil
	}
	return fmt.Errorf("invalid time %q (use RFC 3339 like 2026-01-02T15:04:05Z, a date like 2026-01-02, or a duration ago like 2h)", s)
}

// CurrentUser names the operator for audit records: $USER, else the
// account's name, else "unknown".
func CurrentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "unknown"
}
