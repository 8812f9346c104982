package sideeffect_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgoutbox/outbox/sideeffect"
)

// TestOpenListsUnknownAttemptsAPageAtATime: Admin.Open lists the unknown
// attempts of every name (or one), by name, then next check, a page at a
// time, and leaves out the parked and the settled ones.
func TestOpenListsUnknownAttemptsAPageAtATime(t *testing.T) {
	b := setup(t, sideeffect.Neither)
	ctx := context.Background()
	lost := func(context.Context, string) ([]byte, error) { return nil, errors.New("connection reset") }
	ok := func(context.Context, string) ([]byte, error) { return []byte("ok"), nil }
	var want []string
	for _, name := range []string{"mail.send", "payments.charge"} {
		c := b.caller(t, func(cfg *sideeffect.Config) { cfg.Name = name })
		for _, key := range []string{"k3", "k1", "k2"} {
			if _, err := c.Do(ctx, key, nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
				t.Fatalf("%s %s: %v", name, key, err)
			}
			want = append(want, name+"/"+key) // next checks in the order of the calls
		}
		if _, err := c.Do(ctx, "done", nil, ok); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Do(ctx, "k3", nil, lost); !errors.Is(err, sideeffect.ErrParked) {
			t.Fatalf("%s k3 again: %v; want parked", name, err)
		}
	}
	// k3 of each name is parked now: not open.
	want = []string{want[1], want[2], want[4], want[5]}
	var got []string
	f := sideeffect.OpenFilter{Limit: 3}
	for pages := 0; ; pages++ {
		if pages > 2 {
			t.Fatal("more than 2 pages of 3 for 4 attempts")
		}
		page, err := b.admin.Open(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page.Attempts {
			if a.State != sideeffect.Unknown {
				t.Fatalf("listed %s/%s in state %s", a.Name, a.Key, a.State)
			}
			got = append(got, a.Name+"/"+a.Key)
		}
		if page.Next == nil {
			break
		}
		f.After = page.Next
	}
	if len(got) != len(want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("listed %v, want %v", got, want)
		}
	}
	page, err := b.admin.Open(ctx, sideeffect.OpenFilter{Name: "payments.charge"})
	if err != nil || len(page.Attempts) != 2 || page.Next != nil || page.Attempts[0].Name != "payments.charge" {
		t.Fatalf("one name: %+v, %v", page, err)
	}
}
