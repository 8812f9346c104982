// Package pgident validates and quotes the PostgreSQL schema name that every
// outbox object lives in, so that no query is ever built from an unchecked name.
package pgident

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema used when the user configures none.
const DefaultSchema = "outbox"

var validName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidateSchema returns an error when name cannot be used as a schema name.
// Names are restricted to letters, digits and underscores (at most 63 bytes,
// PostgreSQL's identifier limit) so they read the same quoted or unquoted in
// psql, logs and migration tools.
func ValidateSchema(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("invalid schema name %q: use 1-63 letters, digits or underscores, not starting with a digit", name)
	}
	return nil
}

// Schema is a validated schema name.
type Schema struct{ name string }

// NewSchema validates name ("" means DefaultSchema).
func NewSchema(name string) (Schema, error) {
	if name == "" {
		name = DefaultSchema
	}
	if err := ValidateSchema(name); err != nil {
		return Schema{}, err
	}
	return Schema{name: name}, nil
}

// Name is the unquoted schema name.
func (s Schema) Name() string { return s.name }

// Quoted is the schema name quoted as an SQL identifier.
func (s Schema) Quoted() string { return pgx.Identifier{s.name}.Sanitize() }

// Table returns the quoted, schema-qualified name of table.
func (s Schema) Table(table string) string { return pgx.Identifier{s.name, table}.Sanitize() }

// ErrConflict: a config names its schema twice, in the shared field
// (outbox.Schema) and in its own string field, and the two differ. It is
// outbox.ErrSchemaConflict.
var ErrConflict = errors.New("the schema is named twice, differently")

// Pick returns the schema a config names: shared is its field of type
// outbox.Schema (the value every config of an application shares), legacy
// its older Schema string field. Either may be empty (both empty means
// DefaultSchema); when both are set they must be the same name, else the
// error wraps ErrConflict: neither silently wins.
func Pick(shared, legacy string) (Schema, error) {
	name, err := PickName(shared, legacy)
	if err != nil {
		return Schema{}, err
	}
	return NewSchema(name)
}

// PickName is Pick without the validation: the name chosen, "" when
// neither is set (the caller applies its default).
func PickName(shared, legacy string) (string, error) {
	switch {
	case shared == "":
		return legacy, nil
	case legacy == "" || legacy == shared:
		return shared, nil
	}
	return "", fmt.Errorf("%w: Tables is %q but Schema is %q; set one of them (Schema is the older field, kept for compatibility)", ErrConflict, shared, legacy)
}

var validKey = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$`)

// ValidateKey returns an error when name cannot name a database or a
// destination of a fleet's file: 1-63 letters, digits, '_', '.' or '-',
// starting with a letter, a digit or '_', without "..". Such a name is one
// segment of a console's path (/sources/<database>/<schema>/) as it is,
// with nothing to escape and nothing a path cleaner rewrites, and one word
// in a log line or a metric's label.
func ValidateKey(name string) error {
	if !validKey.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("invalid name %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter, a digit or '_', without '..'", name)
	}
	return nil
}
