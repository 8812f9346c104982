// Package urlopt parses the values of a destination URL's query options,
// the same way for every destination (outboxnats, outboxkafka, outboxamqp,
// outboxwebhook), so that a value one refuses is refused by all.
package urlopt

import (
	"errors"
	"strconv"
	"time"
)

// Duration parses a positive Go duration ("10s", "2m").
func Duration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = errors.New("not a positive duration")
	}
	return d, err
}

// Int parses a positive decimal number that fits an int.
func Int(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err == nil && n < 1 {
		err = errors.New("not a positive number")
	}
	return n, err
}

// Int64 parses a positive decimal number.
func Int64(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil && n < 1 {
		err = errors.New("not a positive number")
	}
	return n, err
}
