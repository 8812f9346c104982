// Package outboxmigrate applies outbox's database migrations.
//
// The migrations are plain, numbered .sql files embedded in the binary
// (see the migrations folder). Object names inside them are unqualified; the
// migrator creates the configured schema and runs each file with search_path
// set to it, inside one transaction per file, under a transaction-level
// advisory lock, so two processes migrating at once are safe: the second
// waits and then finds nothing left to do.
//
// Teams that run their own migration tool can take the files as they are
// (with that tool's search_path pointing at the schema), or print the SQL
// for one schema with [SQL] or `outbox migrate --print`.
//
// A consumer with a database of its own installs only the consumer side
// there (the inbox, side-effect and audit-log tables, the SQL inbox
// functions) with [MigrateComponents] and [ComponentsConsumer] (`outbox
// migrate --only consumer`); [SQLComponents] prints that script.
//
// [Grants] returns the GRANT statements that give the application (writer),
// the relay and the operator's commands each their own least-privilege role
// on a schema (`outbox migrate --print-grants`).
package outboxmigrate
