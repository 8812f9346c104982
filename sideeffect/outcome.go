package sideeffect

import (
	"context"
	"errors"
	"time"
)

// Call makes the external call with key as its idempotency key (in mode
// Queryable and Neither, pass it where the provider keeps it, so that a
// lookup can find it). Its ctx ends at Config.CallTimeout.
//
// It classifies its own outcome by what it returns:
//
//   - (response, nil): the provider accepted it; Succeeded, response recorded;
//   - (response, Rejected(err)): the provider refused it for good (a
//     declined card, a 4xx that is no transport problem); Failed, response
//     recorded, never called again;
//   - (nil, NotSent(err)): the request certainly never reached the provider
//     (connection refused, the request could not be built); nothing is
//     recorded against the provider, the next Do calls again;
//   - (_, any other error): ambiguous, the call may have taken effect (a
//     timeout, a connection reset after the request was written, a lost
//     response, a 5xx); Unknown.
//
// When unsure, return the plain error: Unknown is the safe side.
type Call func(ctx context.Context, key string) (response []byte, err error)

// Rejected marks err as a definite refusal by the provider: the attempt is
// Failed, its response recorded, and it is never called again.
func Rejected(err error) error {
	if err == nil {
		err = errors.New("rejected by the provider")
	}
	return &classified{err: err, kind: kindRejected}
}

// NotSent marks err as a failure before the request could reach the
// provider: nothing happened there, and Do may call again.
func NotSent(err error) error {
	if err == nil {
		err = errors.New("not sent")
	}
	return &classified{err: err, kind: kindNotSent}
}

type kind int

const (
	kindAmbiguous kind = iota
	kindRejected
	kindNotSent
)

type classified struct {
	err  error
	kind kind
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

func classify(err error) kind {
	var c *classified
	if errors.As(err, &c) {
		return c.kind
	}
	return kindAmbiguous
}

// Lookup asks the provider what happened to a key.
type Lookup interface {
	// Lookup returns what the provider knows of key. An error means the
	// question could not be answered (the attempt stays unknown); Found
	// false means the provider has no record of the key: the call never
	// reached it (the caller's CallTimeout has passed, so no request of it
	// is still in flight).
	Lookup(ctx context.Context, key string) (LookupResult, error)
}

// LookupResult is the provider's answer about a key.
type LookupResult struct {
	// Found: the provider has a record of the key.
	Found bool
	// Failed: the record says the call was refused (the attempt becomes
	// Failed); else it took effect (Succeeded).
	Failed bool
	// Response is recorded as the attempt's response.
	Response []byte
}

// LookupFunc adapts a function to Lookup.
type LookupFunc func(ctx context.Context, key string) (LookupResult, error)

// Lookup implements Lookup.
func (f LookupFunc) Lookup(ctx context.Context, key string) (LookupResult, error) { return f(ctx, key) }

// Result is what Do returns about an attempt.
type Result struct {
	// Key is the idempotency key.
	Key string
	// State is the attempt's state after Do: Succeeded or Failed when
	// known, else Unknown, Started (another caller holds it) or Parked.
	State State
	// Response is the provider's response, recorded (Succeeded, Failed).
	Response []byte
	// Error is the recorded error: the provider's refusal (Failed), or the
	// last ambiguous failure (Unknown, Parked).
	Error string
	// Attempts counts the calls made for the key so far, by any caller.
	Attempts int
	// Called: this Do called the provider. Replayed: the outcome was
	// recorded before and returned without a call or a lookup.
	Called   bool
	Replayed bool
	// Via says how the final state was learnt: "call", "lookup" or
	// "operator" (empty while not final).
	Via string
}

// Observer is told what the Caller did, for metrics. It is called
// synchronously and must be safe for concurrent use and fast.
type Observer interface {
	ObserveSideEffect(Observation)
}

// Op is the kind of an Observation.
type Op string

const (
	// OpCall: a call to the provider; State is what was recorded
	// (Succeeded, Failed, Unknown; "" when NotSent or not recorded).
	OpCall Op = "call"
	// OpLookup: a lookup, by Do or the reconciler; LookupResult says what
	// it found.
	OpLookup Op = "lookup"
	// OpReplay: Do returned a recorded outcome without calling.
	OpReplay Op = "replay"
	// OpPark: an attempt was parked; Reason says why.
	OpPark Op = "park"
)

// Lookup results of an Observation.
const (
	LookupSucceeded = "succeeded"
	LookupFailed    = "failed"
	LookupNotFound  = "not_found"
	LookupError     = "error"
)

// Observation describes one thing a Caller did.
type Observation struct {
	// Name is the Caller's name.
	Name string
	Op   Op
	// State is the state recorded by a call.
	State State
	// Blind: the call was a blind retry (mode Neither, BlindRetry), a
	// possible duplicate.
	Blind bool
	// LookupResult is set for OpLookup: LookupSucceeded, LookupFailed,
	// LookupNotFound or LookupError.
	LookupResult string
	// Reason is why an attempt was parked.
	Reason string
	// Duration is the call's or the lookup's.
	Duration time.Duration
	// Err is the call's or the lookup's error, if any.
	Err error
}

func (c *Caller) observe(o Observation) {
	if c.cfg.Observer != nil {
		o.Name = c.cfg.Name
		c.cfg.Observer.ObserveSideEffect(o)
	}
}
