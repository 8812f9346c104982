package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pgoutbox/outbox"
)

// Destination is what the harness needs from the place the relays publish
// to and the consumers read from: a broker of the run's own or an external
// one, the flags that point the processes at it, a way to read back every
// order event with a client of its own (for I3 and I5 at the broker, and
// the duplicate count), the consumers' progress (for WaitConverged), and,
// where the broker can be restarted without losing what it acknowledged,
// Stop and Start for broker faults.
//
// Each kind lives in a file of its own (destination_nats.go,
// destination_kafka.go, destination_amqp.go, destination_webhook.go) that
// registers itself with registerDestination; a new kind is one more such
// file. Optional methods some kinds have are in destination_hints.go.
type Destination interface {
	// Name is the kind: "nats", "kafka".
	Name() string
	// Describe says what and where the destination is, for the output:
	// "embedded JetStream at nats://127.0.0.1:4222, stream CHAOS_1".
	Describe() string
	// URL is the --destination of the relays and consumers.
	URL() string
	// Args are the flags besides --destination that a process of role
	// (RoleRelay, RoleConsumer) needs, such as the NATS stream.
	Args(role string) []string
	// Restartable reports whether Stop and Start keep every message the
	// destination acknowledged, so that broker restarts can be injected.
	Restartable() bool
	// Stop stops the broker (an error when it is not Restartable); Start
	// starts it again on the same address and returns once it accepts
	// connections (nil when it is running already).
	Stop() error
	Start(ctx context.Context) error
	// Restarts is how many times the broker was started again after a
	// Stop.
	Restarts() int
	// Messages reads every order event at the destination with a client
	// of its own, decoded with the destination's Decode: each order's
	// events in the order the destination holds them.
	Messages(ctx context.Context) ([]outbox.Message, error)
	// Progress is the progress of the consumers sharing the durable
	// consumer or group named consumer.
	Progress(ctx context.Context, consumer string) (ConsumerProgress, error)
	// Close closes the harness's clients, removes the stream or topic it
	// made on an external broker unless keep, and stops a broker of its
	// own.
	Close(keep bool) error
}

// ConsumerProgress is how far the consumers are with what is at the
// destination.
type ConsumerProgress struct {
	// Exists is false while the consumer (group) is not created yet.
	Exists bool
	// Pending counts the messages not yet delivered (NATS), or not yet
	// committed (Kafka: the group's lag, end offsets minus committed
	// offsets).
	Pending int64
	// InFlight counts the messages delivered and not yet acknowledged
	// (NATS); 0 where the destination does not know.
	InFlight int64
	// Deliveries counts the deliveries to the consumers, redeliveries
	// included; -1 where the destination does not count them (Kafka).
	Deliveries int64
}

// DestinationConfig is what OpenDestination needs.
type DestinationConfig struct {
	// Spec names the destination: a kind ("nats", "kafka") for a broker
	// of the run's own, or the URL of an external broker
	// ("nats://host:4222", "kafka://host:9092"), which is never restarted.
	Spec string
	// Tag names what the run makes on the broker (stream, subjects,
	// topic), so that runs sharing a broker do not see each other's
	// events; letters, digits and underscores.
	Tag string
	// Dir is where a broker of the run's own keeps its storage.
	Dir string
	// NATSServer is the nats-server executable to run as an own NATS
	// broker; "" embeds one in this process.
	NATSServer string
	// DuplicateWindow is the NATS stream's deduplication window. Defaults
	// to 500ms: short, so republished events reach the consumers twice.
	DuplicateWindow time.Duration
	// AMQPURL is the RabbitMQ broker the kind "amqp" uses: "" starts a
	// node of the run's own (restartable: the chaos run), a URL names a
	// broker that runs already (the demo: the machine's).
	AMQPURL string
	// Partitions is the Kafka topic's partition count. Defaults to 8.
	Partitions int
	// Sink receives a broker process's output lines.
	Sink Sink
	// DatabaseURL and Schema are the run's database and schema, for a
	// destination that reads what the consumers accepted (webhook).
	DatabaseURL, Schema string
}

// destinationKind is one kind of destination: its name, the URL schemes of
// its external brokers, and how to open one. url is "" for a broker of the
// run's own.
type destinationKind struct {
	name    string
	schemes []string
	open    func(ctx context.Context, cfg DestinationConfig, url string) (Destination, error)
}

var destinationKinds = map[string]destinationKind{}

// registerDestination adds a kind; each destination file calls it from
// init.
func registerDestination(k destinationKind) { destinationKinds[k.name] = k }

// DestinationNames lists the kinds OpenDestination knows, sorted.
func DestinationNames() []string {
	var out []string
	for n := range destinationKinds {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// OpenDestination starts (for a kind) or connects to (for a URL) the
// destination cfg.Spec names, and creates the run's stream or topic on it.
// Close it at the end.
func OpenDestination(ctx context.Context, cfg DestinationConfig) (Destination, error) {
	if cfg.DuplicateWindow <= 0 {
		cfg.DuplicateWindow = 500 * time.Millisecond
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 8
	}
	if scheme, _, ok := strings.Cut(cfg.Spec, "://"); ok {
		for _, k := range destinationKinds {
			for _, s := range k.schemes {
				if s == scheme {
					return k.open(ctx, cfg, cfg.Spec)
				}
			}
		}
		return nil, fmt.Errorf("destination URL scheme %q not supported (known: %s)", scheme, strings.Join(DestinationNames(), ", "))
	}
	k, ok := destinationKinds[cfg.Spec]
	if !ok {
		return nil, fmt.Errorf("destination %q: want one of %s, or a URL", cfg.Spec, strings.Join(DestinationNames(), ", "))
	}
	return k.open(ctx, cfg, "")
}

// errNotRestartable is Stop's error for a destination that cannot be
// restarted.
func errNotRestartable(d Destination) error {
	return fmt.Errorf("%s cannot be restarted by the harness", d.Describe())
}
