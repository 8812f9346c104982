package cli

import (
	"flag"

	"github.com/pgoutbox/outbox/internal/redact"
)

// RedactDefault makes --help show flag name's default with hide applied:
// a default taken from the environment (DATABASE_URL, OUTBOX_DESTINATION)
// may hold a password, and the flag package prints defaults as they are.
func RedactDefault(fs *flag.FlagSet, name string, hide func(string) string) {
	if f := fs.Lookup(name); f != nil && f.DefValue != "" {
		f.DefValue = hide(f.DefValue)
	}
}

// hideSecretDefaults redacts the defaults of the flags named database-url
// and destination however they were registered: a backstop for a command
// that registers them itself without RedactDefault.
func hideSecretDefaults(fs *flag.FlagSet) {
	RedactDefault(fs, "database-url", redact.Database)
	RedactDefault(fs, "destination", redact.URL)
}

// DatabaseURLFlag adds --database-url (env DATABASE_URL, default
// DatabaseURLDefault) to fs, its default shown in --help without password
// or sslpassword.
func DatabaseURLFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "database-url", Env("DATABASE_URL", DatabaseURLDefault),
		"PostgreSQL connection URL or key=value string; TLS with sslmode=verify-full&sslrootcert=ca.pem (client certificate: sslcert, sslkey, sslpassword) (env DATABASE_URL; the password is never printed)")
	RedactDefault(fs, "database-url", redact.Database)
}
