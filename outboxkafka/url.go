package outboxkafka

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultPort is the broker port of a URL host without one.
const DefaultPort = "9092"

// ParseURL returns the Config a destination URL describes:
//
//	kafka://host1:9092,host2:9092?topic=outbox.{aggregate_type}&source=/shop&delivery_timeout=10s&dial_timeout=5s&max_record_bytes=1000000
//
// The host part lists the seed brokers, separated by commas (port 9092 when
// left out); every query parameter is optional and sets the Config field of
// its name, with the same defaults. Unknown parameters are refused, and so
// are credentials in the URL (TLS and SASL are not configurable from a URL
// yet: pass kgo options to NewPublisher). Errors never repeat the URL's
// password.
func ParseURL(raw string) (Config, error) {
	var cfg Config
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme != "kafka" {
		return cfg, fmt.Errorf("outboxkafka: destination URL: scheme %q, want kafka://host:port", scheme)
	}
	// url.Parse takes one host only: the broker list is split here.
	hosts, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		hosts, tail = rest[:i], rest[i:]
	}
	if strings.Contains(hosts, "@") {
		return cfg, errors.New("outboxkafka: destination URL: credentials in the URL are not supported yet")
	}
	shown := "kafka://" + hosts
	u, err := url.Parse("kafka://h" + tail)
	if err != nil {
		return cfg, fmt.Errorf("outboxkafka: destination %s: %w", shown, err)
	}
	if u.Path != "" && u.Path != "/" {
		return cfg, fmt.Errorf("outboxkafka: destination %s: unexpected path %q (the topic is the topic parameter)", shown, u.Path)
	}
	if u.Fragment != "" {
		return cfg, fmt.Errorf("outboxkafka: destination %s: unexpected fragment", shown)
	}
	for _, b := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			host, port = strings.TrimSuffix(strings.TrimPrefix(b, "["), "]"), DefaultPort
		}
		if host == "" || strings.ContainsAny(host, "[]/ ") {
			return cfg, fmt.Errorf("outboxkafka: destination %s: bad broker address %q", shown, b)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return cfg, fmt.Errorf("outboxkafka: destination %s: broker %q: bad port", shown, b)
		}
		cfg.Brokers = append(cfg.Brokers, net.JoinHostPort(host, port))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return cfg, fmt.Errorf("outboxkafka: destination %s: query: %w", shown, err)
	}
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "topic":
			cfg.Topic = v
		case "source":
			cfg.Source = v
		case "delivery_timeout":
			cfg.DeliveryTimeout, err = positiveDuration(v)
		case "dial_timeout":
			cfg.DialTimeout, err = positiveDuration(v)
		case "max_record_bytes":
			cfg.MaxRecordBytes, err = strconv.Atoi(v)
			if err == nil && cfg.MaxRecordBytes < 1 {
				err = errors.New("not a positive number")
			}
		default:
			err = errors.New("unknown parameter (known: topic, source, delivery_timeout, dial_timeout, max_record_bytes)")
		}
		if err != nil {
			return Config{}, fmt.Errorf("outboxkafka: destination %s: %s=%q: %w", shown, k, v, err)
		}
	}
	if cfg.Topic != "" {
		if _, err := Topic(cfg.Topic, "t"); err != nil {
			return Config{}, fmt.Errorf("outboxkafka: destination %s: topic template %q: %w", shown, cfg.Topic, err)
		}
	}
	return cfg, nil
}

func positiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = errors.New("not a positive duration")
	}
	return d, err
}
