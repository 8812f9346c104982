package payments

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/sideeffect"
)

// chargeLookup asks the provider what happened to a charge key: by key in
// idempotent mode, by reference (the key is the charge's reference) in
// queryable mode; mode neither has no lookup.
func chargeLookup(c *provider.Client, mode provider.Mode) sideeffect.Lookup {
	switch mode {
	case provider.ModeIdempotent:
		return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			ch, err := c.LookupByKey(ctx, key)
			if errors.Is(err, provider.ErrNotFound) {
				return sideeffect.LookupResult{}, nil
			}
			if err != nil {
				return sideeffect.LookupResult{}, err
			}
			return chargeFound(ch)
		})
	case provider.ModeQueryable:
		return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			chs, err := c.LookupByReference(ctx, key)
			if err != nil || len(chs) == 0 {
				return sideeffect.LookupResult{}, err
			}
			for _, ch := range chs {
				if ch.Status == provider.ChargeSucceeded {
					return chargeFound(ch)
				}
			}
			return chargeFound(chs[0])
		})
	}
	return nil
}

func chargeFound(ch provider.Charge) (sideeffect.LookupResult, error) {
	b, err := json.Marshal(ch)
	return sideeffect.LookupResult{Found: true, Failed: ch.Status != provider.ChargeSucceeded, Response: b}, err
}

// refundLookup is chargeLookup for refunds; in queryable mode the refunds
// are looked up by their charge's reference.
func refundLookup(c *provider.Client, mode provider.Mode) sideeffect.Lookup {
	switch mode {
	case provider.ModeIdempotent:
		return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			rf, err := c.LookupRefundByKey(ctx, key)
			if errors.Is(err, provider.ErrNotFound) {
				return sideeffect.LookupResult{}, nil
			}
			if err != nil {
				return sideeffect.LookupResult{}, err
			}
			return refundFound(rf)
		})
	case provider.ModeQueryable:
		return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			orderID, _ := strings.CutSuffix(key, "/refund")
			rfs, err := c.LookupRefundsByReference(ctx, ChargeKey(orderID))
			if err != nil || len(rfs) == 0 {
				return sideeffect.LookupResult{}, err
			}
			for _, rf := range rfs {
				if rf.Status == provider.RefundSucceeded {
					return refundFound(rf)
				}
			}
			return refundFound(rfs[0])
		})
	}
	return nil
}

func refundFound(rf provider.Refund) (sideeffect.LookupResult, error) {
	b, err := json.Marshal(rf)
	return sideeffect.LookupResult{Found: true, Failed: rf.Status != provider.RefundSucceeded, Response: b}, err
}
