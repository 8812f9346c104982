package provider

// The idempotency rules of POST /charges and POST /refunds: keys in flight,
// stored outcomes replayed, reuse with another request refused.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// outcome is an executed request's answer: what was stored for its key.
type outcome struct {
	status   int
	body     []byte // JSON
	replayed bool
}

// hooks are the faults of one request, run by execute.
type hooks struct {
	beforeWork   func(ctx context.Context) error // latency
	beforeCommit func() error                    // error before commit
}

// requestHash identifies a request's endpoint and content for idempotency:
// canonical JSON, so whitespace and field order do not matter.
func requestHash(endpoint string, req any) []byte {
	b, _ := json.Marshal(req)
	h := sha256.New()
	h.Write([]byte(endpoint))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(nil)
}

// execute runs work in a transaction under the provider's idempotency rules.
// In idempotent mode with a key, a key in flight is refused, a stored key
// is replayed (or refused if its request differs), and the outcome is stored
// with the key in work's transaction.
func (s *Service) execute(ctx context.Context, endpoint, key string, req any, h hooks,
	work func(tx pgx.Tx) (status int, body any, objectID string, err error)) (outcome, error) {
	honour := key != "" && s.cfg.Mode == ModeIdempotent
	if honour {
		if !s.enter(key) {
			return outcome{}, refuse(InProgress, "a request with this Idempotency-Key is in progress; retry later")
		}
		defer s.leave(key)
	}
	if h.beforeWork != nil {
		if err := h.beforeWork(ctx); err != nil {
			return outcome{}, err
		}
	}
	hash := requestHash(endpoint, req)
	var out outcome
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if honour {
			// Another provider process on the same schema: the key is
			// locked for the transaction, and a holder makes this request
			// a conflict too.
			var locked bool
			if err := tx.QueryRow(ctx, s.q.lockKey, key, s.cfg.Schema).Scan(&locked); err != nil {
				return fmt.Errorf("lock idempotency key: %w", err)
			}
			if !locked {
				return refuse(InProgress, "a request with this Idempotency-Key is in progress; retry later")
			}
			var storedEndpoint string
			var storedHash []byte
			err := tx.QueryRow(ctx, s.q.selectKey, key).Scan(&storedEndpoint, &storedHash, &out.status, &out.body)
			if err == nil {
				if storedEndpoint != endpoint || !bytes.Equal(storedHash, hash) {
					return refuse(KeyReused, "this Idempotency-Key was used for a different request (POST /%s)", storedEndpoint)
				}
				out.replayed = true
				return runHook(h.beforeCommit)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read idempotency key: %w", err)
			}
		}
		status, body, id, err := work(tx)
		if err != nil {
			return err
		}
		if out.body, err = json.Marshal(body); err != nil {
			return err
		}
		out.status = status
		if honour {
			if _, err := tx.Exec(ctx, s.q.insertKey, key, endpoint, hash, status, out.body, id); err != nil {
				return fmt.Errorf("record idempotency key: %w", err)
			}
		}
		return runHook(h.beforeCommit)
	})
	if err != nil {
		return outcome{}, err
	}
	return out, nil
}

func runHook(f func() error) error {
	if f == nil {
		return nil
	}
	return f()
}

func (s *Service) enter(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[key] {
		return false
	}
	s.inFlight[key] = true
	return true
}

func (s *Service) leave(key string) {
	s.mu.Lock()
	delete(s.inFlight, key)
	s.mu.Unlock()
}

func (s *Service) busy(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight[key]
}

// InFlight counts the Idempotency-Keys being executed now.
func (s *Service) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inFlight)
}
