// Package chaos runs the example order system as real processes and proves
// the outbox's invariants under faults: it is the harness of the boundary
// tests (a process crashed at each failpoint), of the infrastructure fault
// tests (broker and PostgreSQL restarts, a relay paused past its lease), of
// "outbox chaos" and of "outbox demo", which runs the system in one process
// but drives it with the same Driver and checks it with the same Check.
//
// # Pieces
//
//   - Build compiles the outbox and orders binaries (tests build them once
//     per run, with -race when the tests have it, and with -tags for the
//     deliberately broken build of the checker's own test).
//   - Process runs one child process whose output lines go to a Sink; it
//     dies with its parent (PR_SET_PDEATHSIG) so nothing is left behind.
//   - Destination is where the relays publish and the consumers read, one
//     file per kind: NATS (an own Broker, a nats-server process or an
//     embedded one that can be stopped and started again on the same port
//     and storage, or an external server) and Kafka (franz-go's in-process
//     kfake cluster, persisted to disk and restartable on its port, or an
//     external cluster). It gives the
//     processes their destination flags, reads every event back for Check
//     and reports the consumers' progress.
//   - System runs the order system's members ("api", "relay-N",
//     "consumer-N"): start (with OUTBOX_FAILPOINTS), kill, pause, resume,
//     stop, and a record of how each incarnation ended.
//   - Driver sends commands over HTTP (creates with and without
//     Idempotency-Key, resends, a key reused with another body, rollbacks on
//     an unknown SKU, cancellations, second cancellations) and keeps a Ledger of what the client knows:
//     committed, rolled back, or ambiguous (a 500 or a lost connection),
//     settled by a retry with the same key or, at the end, from the database.
//   - Check compares PostgreSQL, the destination and the consumers' tables with
//     the Ledger and reports violations of I1-I5, request idempotency and
//     unexpected answers.
//   - NewSchedule draws a run's faults from a seed; Run is "outbox chaos".
//
// docs/chaos.md lists the failpoints, the tests and how to run chaos.
package chaos
