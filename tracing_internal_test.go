package queen

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/e03140bc/queen/fusion"
)

// A flush of more push calls than MaxFlushLinks links the first
// MaxFlushLinks distinct recording send spans, each once, and no ended one.
func TestFlushSpanCapsLinks(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	e := &engine{tracer: tracerOf(tp)}
	tr := tp.Tracer("test")

	_, ended := tr.Start(context.Background(), "ended")
	ended.End()
	var sends []trace.Span
	bundle := []*fusion.Batch[partitionKey, *pushItem]{{Items: []*pushItem{{send: ended}, {}}}}
	for i := range MaxFlushLinks + 8 {
		_, s := tr.Start(context.Background(), "send")
		defer s.End()
		sends = append(sends, s)
		// Two items per call, in two batches, the second call's items
		// interleaved with the first's.
		b := &fusion.Batch[partitionKey, *pushItem]{Items: []*pushItem{{send: s}, {send: s}}}
		if i > 0 {
			b.Items = append(b.Items, &pushItem{send: sends[i-1]})
		}
		bundle = append(bundle, b)
	}
	_, end := e.startFlush(context.Background(), bundle)
	end(nil)
	var flush sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "queen.flush" {
			flush = s
		}
	}
	if flush == nil {
		t.Fatal("no flush span")
	}
	links := flush.Links()
	if len(links) != MaxFlushLinks {
		t.Fatalf("%d links, want MaxFlushLinks (%d)", len(links), MaxFlushLinks)
	}
	for i, l := range links {
		if l.SpanContext.SpanID() != sends[i].SpanContext().SpanID() {
			t.Fatalf("link %d is to %s, want the send span %s", i, l.SpanContext.SpanID(), sends[i].SpanContext().SpanID())
		}
	}

	// No recording submitter: no span.
	n := len(rec.Ended())
	_, end = e.startFlush(context.Background(), []*fusion.Batch[partitionKey, *pushItem]{{Items: []*pushItem{{send: ended}, {}}}})
	end(nil)
	if len(rec.Ended()) != n {
		t.Fatal("a flush span without a recording submitter")
	}
}

// Every no-op provider, the trace package's deprecated one included, means
// no tracing: no span is started on the hot path. A real one is kept.
func TestTracerOfNoop(t *testing.T) {
	//lint:ignore SA1019 the deprecated no-op is what a caller may still pass
	old := trace.NewNoopTracerProvider()
	for name, tp := range map[string]trace.TracerProvider{"trace.NewNoopTracerProvider": old, "noop": noop.NewTracerProvider()} {
		if tracerOf(tp) != nil {
			t.Errorf("%s: got a tracer, want none", name)
		}
	}
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	if tracerOf(tp) == nil {
		t.Error("SDK provider: got no tracer")
	}
}
