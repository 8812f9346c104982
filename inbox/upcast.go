package inbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/pgoutbox/outbox"
)

// Upcaster upgrades one event type's payload by one schema version: from
// the version it was registered for to the next. It must not modify
// payload in place.
type Upcaster func(payload []byte) ([]byte, error)

// Upcasters holds the upcasters of a consumer, by event type and version.
// The zero value is ready to use (a nil *Upcasters upcasts nothing), and it
// is safe for concurrent use.
type Upcasters struct {
	mu    sync.RWMutex
	steps map[string]map[int]Upcaster // event type -> from version -> upcaster
}

// maxUpcastSteps bounds a chain, so that a registration mistake cannot loop.
const maxUpcastSteps = 1000

// Register adds the upcaster that turns eventType's payload of version from
// into version from+1. Registering the same step twice is an error.
func (u *Upcasters) Register(eventType string, from int, up Upcaster) error {
	switch {
	case eventType == "":
		return errors.New("inbox: upcaster for an empty event type")
	case from < 1:
		return fmt.Errorf("inbox: upcaster for %s from version %d: versions start at 1", eventType, from)
	case up == nil:
		return fmt.Errorf("inbox: upcaster for %s v%d is nil", eventType, from)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.steps == nil {
		u.steps = map[string]map[int]Upcaster{}
	}
	if u.steps[eventType] == nil {
		u.steps[eventType] = map[int]Upcaster{}
	}
	if u.steps[eventType][from] != nil {
		return fmt.Errorf("inbox: upcaster for %s v%d → v%d registered twice", eventType, from, from+1)
	}
	u.steps[eventType][from] = up
	return nil
}

// MustRegister is Register that panics on error, for registrations at
// start-up.
func (u *Upcasters) MustRegister(eventType string, from int, up Upcaster) {
	if err := u.Register(eventType, from, up); err != nil {
		panic(err)
	}
}

// Upcast returns msg upgraded through every registered step of its event
// type, starting at its SchemaVersion (0 counts as 1): with the new payload
// and SchemaVersion. A message without registered steps comes back as it
// is. An upcaster's error, or a payload an upcaster turned into invalid
// JSON, is returned with the event's id and versions.
func (u *Upcasters) Upcast(msg outbox.Message) (outbox.Message, error) {
	if u == nil {
		return msg, nil
	}
	if msg.SchemaVersion == 0 {
		msg.SchemaVersion = 1
	}
	for i := 0; i < maxUpcastSteps; i++ {
		u.mu.RLock()
		up := u.steps[msg.Type][msg.SchemaVersion]
		u.mu.RUnlock()
		if up == nil {
			return msg, nil
		}
		payload, err := up(msg.Payload)
		if err != nil {
			return msg, fmt.Errorf("inbox: upcast event %s (%s) from v%d to v%d: %w", msg.ID, msg.Type, msg.SchemaVersion, msg.SchemaVersion+1, err)
		}
		if !json.Valid(payload) {
			return msg, fmt.Errorf("inbox: upcast event %s (%s) from v%d to v%d: the upcaster returned invalid JSON", msg.ID, msg.Type, msg.SchemaVersion, msg.SchemaVersion+1)
		}
		msg.Payload = payload
		msg.SchemaVersion++
	}
	return msg, fmt.Errorf("inbox: upcast event %s (%s): more than %d steps", msg.ID, msg.Type, maxUpcastSteps)
}
