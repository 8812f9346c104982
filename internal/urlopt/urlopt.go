// Package urlopt parses the values of a destination URL's query options,
// the same way for every destination (outboxnats, outboxkafka, outboxamqp,
// outboxwebhook), so that a value one refuses is refused by all. Its errors
// never quote the value: whatever was typed there (a misplaced secret
// included) stays out of logs.
package urlopt

import (
	"errors"
	"strconv"
	"time"
)

// Duration parses a positive Go duration ("10s", "2m").
func Duration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, errors.New("not a duration (such as 10s or 2m)")
	case d <= 0:
		return 0, errors.New("not a positive duration")
	}
	return d, nil
}

// Int parses a positive decimal number that fits an int.
func Int(v string) (int, error) {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return 0, errors.New("not a positive number (decimal digits)")
	case n < 1:
		return 0, errors.New("not a positive number")
	}
	return n, nil
}

// Int64 parses a positive decimal number.
func Int64(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		return 0, errors.New("not a positive number (decimal digits)")
	case n < 1:
		return 0, errors.New("not a positive number")
	}
	return n, nil
}

// Bool parses true or false (and strconv.ParseBool's other spellings: 1,
// 0, t, f, TRUE, ...).
func Bool(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errors.New("not true or false")
	}
	return b, nil
}
