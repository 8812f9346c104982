package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/sideeffect"
)

// Roles of the saga's processes (SystemConfig.Saga).
const (
	RolePayments = "payments" // orders payments
	RoleSaga     = "saga"     // orders saga run
	RoleProvider = "provider" // orders provider
)

// sagaMembers are the members the saga adds, by name and role.
var sagaMembers = [][2]string{{"payments", RolePayments}, {"saga", RoleSaga}, {"provider", RoleProvider}}

// ProviderURL is the payment provider's base URL; ProviderControlURL its
// control listener's.
func (s *System) ProviderURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(s.cfg.ProviderPort)
}

// ProviderControlURL is the base URL of the provider's control listener.
func (s *System) ProviderControlURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(s.cfg.ProviderControlPort)
}

// ProviderClient is a client of the provider and its control listener.
func (s *System) ProviderClient() *provider.Client {
	return provider.NewClient(s.ProviderURL(), s.ProviderControlURL(), &http.Client{Timeout: 10 * time.Second})
}

// sagaSpec is the command line of a saga member.
func (s *System) sagaSpec(m *member, name string) ProcessSpec {
	c := s.cfg
	db := []string{"--schema", c.Schema}
	dest := append([]string{"--destination", c.Destination.URL()}, c.Destination.Args(RoleConsumer)...)
	switch m.role {
	case RoleProvider:
		return ProcessSpec{Name: name, Path: c.Bins.Orders, Args: append([]string{"provider", "--mode", c.ProviderMode,
			"--listen", "127.0.0.1:" + strconv.Itoa(c.ProviderPort), "--control-listen", "127.0.0.1:" + strconv.Itoa(c.ProviderControlPort)}, db...)}
	case RolePayments:
		args := append([]string{"payments", "--provider-url", s.ProviderURL(), "--provider-mode", c.ProviderMode,
			"--ack-wait", "15s", "--call-timeout", "2s", "--workers", "2"}, db...)
		return ProcessSpec{Name: name, Path: c.Bins.Orders, Args: append(args, dest...)}
	default:
		args := append([]string{"saga", "run", "--workers", "2"}, db...)
		return ProcessSpec{Name: name, Path: c.Bins.Orders, Args: append(args, dest...)}
	}
}

// ProviderFaults are the provider faults chaos injects through the control
// listener, each for a while: ambiguous outcomes after the charge or the
// refund committed.
var ProviderFaults = []string{
	"timeout-after-commit:p=0.3,hang=5s",
	"drop-response:p=0.3",
	"error-after-commit:p=0.3",
}

// setProviderFaults replaces the provider's faults ("" clears them).
func (s *System) setProviderFaults(ctx context.Context, spec string) error {
	var f provider.Faults
	if spec != "" {
		r, err := provider.ParseRule(spec)
		if err != nil {
			return err
		}
		f.Rules = []provider.Rule{r}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.ProviderClient().SetFaults(ctx, f); err != nil {
		return fmt.Errorf("provider faults %q: %w", spec, err)
	}
	return nil
}

// FaultProvider sets one of ProviderFaults (Fault.Rule) on the provider for
// Fault.For.
const FaultProvider FaultKind = "provider"

// providerFaults draws the saga's own faults: the payments consumer
// crashing between a provider call and its record twice (early and
// midway), and provider faults, about one every 4×Every, each for 2-6s.
func providerFaults(cfg ScheduleConfig, warmup, end time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x70726f7669646572))
	var s Schedule
	for _, at := range []time.Duration{warmup + time.Second, warmup + (end-warmup)/2} {
		if at < end {
			s = append(s, Fault{At: at, Kind: FaultFailpoint, Target: "payments",
				Rule: fmt.Sprintf("%s=crash@%d", sideeffect.FailpointAfterCallBeforeRecord, 1+rng.IntN(5)), For: 5 * time.Second})
		}
	}
	for at := warmup; ; {
		at += min(time.Duration(rng.ExpFloat64()*float64(4*cfg.Every)), 12*cfg.Every) + 50*time.Millisecond
		if at >= end {
			break
		}
		s = append(s, Fault{At: at, Kind: FaultProvider, Target: "provider", Rule: ProviderFaults[rng.IntN(len(ProviderFaults))],
			For: 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))})
	}
	return s
}
