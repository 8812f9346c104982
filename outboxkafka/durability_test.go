package outboxkafka_test

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestCheckDurability: what a Kafka acknowledgement (acks=all) is worth,
// judged on an in-process cluster of three kfake brokers, which report a
// topic's replication factor in their metadata and its min.insync.replicas
// through DescribeConfigs as Kafka does (kfake does not really replicate:
// only the check's reading of the cluster is tested, not replication). A
// topic with replication factor 1, or replication factor 3 with the
// default min.insync.replicas=1, is not durable; replication factor 3 with
// min.insync.replicas=2 is; with no topic the template can name there is
// nothing to check, which is not durable either. Topics the template cannot
// name do not count, and one weak topic among good ones is reported.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	create := func(t *testing.T, topic string, rf int16, minISR string) {
		t.Helper()
		var configs map[string]*string
		if minISR != "" {
			configs = map[string]*string{"min.insync.replicas": &minISR}
		}
		resp, err := adm.CreateTopic(testCtx(t), 2, rf, configs, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("create topic %s (RF %d): %v", topic, rf, err)
		}
	}
	check := func(t *testing.T, template string) outbox.DurabilityReport {
		t.Helper()
		rep, err := publisher(t, c, outboxkafka.Config{Topic: template}).CheckDurability(testCtx(t))
		if err != nil {
			t.Fatalf("CheckDurability: %v", err)
		}
		t.Logf("%+v", rep)
		if rep.Destination != "kafka" || strings.Contains(rep.Summary, "\n") {
			t.Errorf("report %+v: want destination kafka and one line", rep)
		}
		return rep
	}
	create(t, "rf1.order", 1, "")
	create(t, "isr1.order", 3, "")
	create(t, "good.order", 3, "2")
	create(t, "good.payment", 3, "2")
	create(t, "mixed.order", 3, "2")
	create(t, "mixed.payment", 1, "")
	create(t, "mixed-other", 1, "") // not a name mixed.{aggregate_type} makes
	cases := []struct {
		template string
		durable  bool
		reason   string
		mention  []string // in the summary
	}{
		{"rf1.{aggregate_type}", false, "replication_factor_1", []string{"rf1.order", "replication factor 3 and min.insync.replicas=2"}},
		{"isr1.{aggregate_type}", false, "min_insync_replicas_1", []string{"isr1.order", "min.insync.replicas=2"}},
		{"good.{aggregate_type}", true, "replicated", []string{"2 topics", "at least 2 brokers"}},
		{"good.order", true, "replicated", []string{"good.order"}},
		{"mixed.{aggregate_type}", false, "replication_factor_1", []string{"mixed.payment"}},
		{"none.{aggregate_type}", false, "no_topic", []string{"none.{aggregate_type}", "replication factor 3"}},
	}
	for _, tc := range cases {
		t.Run(tc.template, func(t *testing.T) {
			t.Parallel()
			rep := check(t, tc.template)
			if rep.Durable != tc.durable || rep.Reason != tc.reason {
				t.Fatalf("durable %v reason %q, want %v %q", rep.Durable, rep.Reason, tc.durable, tc.reason)
			}
			for _, m := range tc.mention {
				if !strings.Contains(rep.Summary, m) {
					t.Errorf("summary %q does not mention %q", rep.Summary, m)
				}
			}
			if strings.Contains(rep.Summary, "mixed-other") {
				t.Errorf("summary %q counts a topic the template cannot name", rep.Summary)
			}
		})
	}
}

// TestCheckDurabilityUnreachable: a cluster that cannot be asked is an
// error marked unavailable (the relay tries again), not a report.
func TestCheckDurabilityUnreachable(t *testing.T) {
	t.Parallel()
	c := cluster(t, 1, "outbox.order")
	p := publisher(t, c, outboxkafka.Config{})
	c.Close()
	if _, err := p.CheckDurability(testCtx(t)); !outbox.IsUnavailable(err) {
		t.Fatalf("CheckDurability with the cluster closed: %v, want unavailable", err)
	}
}
