package otelexport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/otelexport"
)

// Not parallel: the tests set environment variables.

func TestConsoleWritesSpans(t *testing.T) {
	t.Setenv(otelexport.EnvExporter, "console")
	t.Setenv("OTEL_SERVICE_NAME", "")
	var buf bytes.Buffer
	tp, shutdown, err := otelexport.FromEnv(context.Background(), "outbox-relay", &buf)
	if err != nil || tp == nil {
		t.Fatalf("FromEnv: %v, %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "send order")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Name     string
		Resource []struct {
			Key   string
			Value struct{ Value any }
		}
	}
	if err := json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &got); err != nil {
		t.Fatalf("console output is not one JSON span: %v\n%s", err, buf.String())
	}
	service := ""
	for _, kv := range got.Resource {
		if kv.Key == "service.name" {
			service, _ = kv.Value.Value.(string)
		}
	}
	if got.Name != "send order" || service != "outbox-relay" {
		t.Errorf("span %q of service %q, want send order of outbox-relay", got.Name, service)
	}
}

func TestOffUnlessAsked(t *testing.T) {
	for _, v := range []string{"", "none"} {
		t.Setenv(otelexport.EnvExporter, v)
		tp, shutdown, err := otelexport.FromEnv(context.Background(), "x", nil)
		if tp != nil || err != nil || shutdown(context.Background()) != nil {
			t.Errorf("%s=%q: provider %v, error %v; want none", otelexport.EnvExporter, v, tp, err)
		}
	}
	t.Setenv(otelexport.EnvExporter, "otlp")
	if _, _, err := otelexport.FromEnv(context.Background(), "x", nil); err == nil || !strings.Contains(err.Error(), "not built into this binary") {
		t.Errorf("otlp: error %v, want one saying it is not built in", err)
	}
}
