package outbox

import "github.com/pgoutbox/outbox/internal/pgident"

// Schema names the PostgreSQL schema that holds the outbox's tables, and
// the inbox's and the side effects' when they share it. Declare it once and
// give the same value to every component's config, in its Tables field
// (WriterConfig, RelayConfig, NotifierConfig, AdminConfig, inbox.Config,
// inbox.AdminConfig, sideeffect.Config, sideeffect.AdminConfig,
// outboxcdc.Config, outboxprom.Config, outboxconsole.Config), and to
// outboxmigrate.Options:
//
//	const billing = outbox.Schema("billing")
//	w, err := outbox.NewWriter(outbox.WriterConfig{Tables: billing})
//	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Tables: billing, Publisher: pub})
//
// The empty Schema means "not set": the config's older Schema string field
// then decides, and without it the default, "outbox". Setting both to
// different names is refused by the constructor with an error wrapping
// ErrSchemaConflict; neither silently wins. A name is 1-63 letters, digits
// or underscores, not starting with a digit, checked by every constructor
// (and by Validate).
type Schema string

// SchemaDefault is the schema used when a config names none.
const SchemaDefault Schema = pgident.DefaultSchema

// ErrSchemaConflict is returned (wrapped) by a constructor whose config
// names two different schemas, in Tables and in its older Schema field.
var ErrSchemaConflict = pgident.ErrConflict

// Validate returns an error when s cannot be a schema name; the empty
// Schema (not set) is valid.
func (s Schema) Validate() error {
	if s == "" {
		return nil
	}
	return pgident.ValidateSchema(string(s))
}

// Name is the schema's name, SchemaDefault's when s is not set.
func (s Schema) Name() string {
	if s == "" {
		return string(SchemaDefault)
	}
	return string(s)
}
