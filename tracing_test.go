package queen_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/e03140bc/queen"
)

func traced(t *testing.T) (*queen.Client, *tracetest.SpanRecorder, trace.Tracer) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := open(t, func(cfg *queen.Config) { cfg.TracerProvider, cfg.Propagator = tp, propagation.TraceContext{} })
	return c, rec, tp.Tracer("test")
}

func spanNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A push inside a parent span records a producer span under it whose
// context travels in the message's headers; Consume's process span is its
// child, in the same trace, and carries an error status when the handler
// fails.
func TestTracingPushThenConsume(t *testing.T) {
	c, rec, tr := traced(t)
	ctx, parent := tr.Start(ctxT(t), "parent")
	q := c.Queue("q")
	if _, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte("a")}, {Partition: "p", Data: []byte("b"), Headers: map[string]string{"x": "y"}}}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	sends := spanNamed(rec, "send q")
	if len(sends) != 1 {
		t.Fatalf("%d send spans", len(sends))
	}
	send := sends[0]
	if send.Parent().SpanID() != parent.SpanContext().SpanID() || send.SpanKind() != trace.SpanKindProducer ||
		attrOf(send, "messaging.system").AsString() != "queen" || attrOf(send, "messaging.destination.name").AsString() != "q" ||
		attrOf(send, "messaging.batch.message_count").AsInt64() != 2 {
		t.Fatalf("send span: parent %v kind %v attrs %v", send.Parent(), send.SpanKind(), send.Attributes())
	}

	var handled atomic.Int32
	var inHandler atomic.Value
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", AutoAck: true}}, func(hctx context.Context, m *queen.Message) error {
		if m.Headers["traceparent"] == "" || (string(m.Data) == "b" && m.Headers["x"] != "y") {
			t.Errorf("headers %q", m.Headers)
		}
		inHandler.Store(trace.SpanContextFromContext(hctx))
		if handled.Add(1) == 2 {
			return errors.New("boom")
		}
		return nil
	}, func() bool { return handled.Load() == 2 })
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	procs := spanNamed(rec, "process q")
	if len(procs) != 2 {
		t.Fatalf("%d process spans", len(procs))
	}
	for i, p := range procs {
		if p.SpanContext().TraceID() != parent.SpanContext().TraceID() || p.Parent().SpanID() != send.SpanContext().SpanID() {
			t.Fatalf("process span %d: trace %s parent %s, want trace %s parent %s", i, p.SpanContext().TraceID(),
				p.Parent().SpanID(), parent.SpanContext().TraceID(), send.SpanContext().SpanID())
		}
		if p.SpanKind() != trace.SpanKindConsumer || attrOf(p, "messaging.destination.partition.id").AsString() != "p" ||
			attrOf(p, "messaging.consumer.group.name").AsString() != "g" || attrOf(p, "messaging.message.id").AsString() == "" {
			t.Fatalf("process span %d: kind %v attrs %v", i, p.SpanKind(), p.Attributes())
		}
	}
	if procs[0].Status().Code == codes.Error || procs[1].Status().Code != codes.Error {
		t.Fatalf("statuses %v, %v: want the failed handler's span only in error", procs[0].Status(), procs[1].Status())
	}
	if et := attrOf(procs[1], "error.type").AsString(); et != "*errors.errorString" {
		t.Fatalf("failed process span error.type %q, want the error's Go type", et)
	}
	if attrOf(procs[0], "error.type").Type() != attribute.EMPTY {
		t.Fatal("succeeded process span has an error.type")
	}
	if sc := inHandler.Load().(trace.SpanContext); sc.SpanID() != procs[1].SpanContext().SpanID() {
		t.Fatal("the handler's context does not carry its process span")
	}

	// ContextFrom gives a Pop user the creation context.
	if _, err := q.Push(ctx, []queen.Item{{Partition: "p2", Data: []byte("c")}}); err != nil {
		t.Fatal(err)
	}
	m := pop(t, q, queen.PopOptions{Partition: "p2", AutoAck: true})[0]
	sc := trace.SpanContextFromContext(queen.ContextFrom(context.Background(), m))
	if !sc.IsRemote() || sc.TraceID() != parent.SpanContext().TraceID() {
		t.Fatalf("ContextFrom: %v", sc)
	}
}

// PushTx and Tx.Push each record a send span under the caller's; a
// panicking handler's process span is in error.
func TestTracingPushTxTxPushAndPanic(t *testing.T) {
	c, rec, tr := traced(t)
	ctx, parent := tr.Start(ctxT(t), "parent")
	defer parent.End()
	if err := pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		_, err := c.Queue("q").PushTx(ctx, tx, []queen.Item{{Data: []byte("ptx")}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Data: []byte("tx")}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	q := c.Queue("q")
	cctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	// The panic skips consumeUntil's stop check: cancel on the way out.
	_ = q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{AutoAck: true}}, func(context.Context, *queen.Message) error {
		defer cancel()
		panic("poison")
	})
	// An auto-acked claim takes no lease: a wake from the second push may
	// claim its message while the first one's handler runs, and a message
	// auto-acked is handled even after the stop (it panics too).
	sends, procs := spanNamed(rec, "send q"), spanNamed(rec, "process q")
	if len(sends) != 2 || len(procs) < 1 || len(procs) > 2 {
		t.Fatalf("%d send and %d process spans", len(sends), len(procs))
	}
	for i, p := range procs {
		if p.Status().Code != codes.Error || attrOf(p, "error.type").AsString() != "panic" {
			t.Fatalf("process span %d: status %v attrs %v", i, p.Status(), p.Attributes())
		}
	}
	for _, s := range sends {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Fatalf("send span parent %v", s.Parent())
		}
	}
	// The first message consumed is PushTx's.
	if procs[0].Parent().SpanID() != sends[0].SpanContext().SpanID() || procs[0].Status().Code != codes.Error ||
		attrOf(procs[0], "error.type").AsString() != "panic" {
		t.Fatalf("process span: parent %v status %v attrs %v", procs[0].Parent(), procs[0].Status(), procs[0].Attributes())
	}
}

// With a no-op provider nothing is recorded and no header is added.
func TestTracingNoopAddsNothing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("test").Start(ctxT(t), "parent")
	defer parent.End()
	c := open(t, func(cfg *queen.Config) {
		cfg.TracerProvider, cfg.Propagator = noop.NewTracerProvider(), propagation.TraceContext{}
	})
	q := c.Queue("q")
	if _, err := q.Push(ctx, []queen.Item{{Data: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	m := pop(t, q, queen.PopOptions{AutoAck: true})
	if len(m) != 1 || m[0].Headers != nil {
		t.Fatalf("popped %+v", m)
	}
}

// A client left on the global provider traces nothing (and costs nothing)
// until the application installs an SDK, then traces without reopening.
// It changes the global provider: not parallel, and it leaves a no-op one.
func TestTracingGlobalProviderInstalledAfterOpen(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.Propagator = propagation.TraceContext{} })
	q := c.Queue("global")
	push(t, q, queen.Item{Data: []byte("before")})
	m := pop(t, q, queen.PopOptions{})
	if len(m) != 1 || len(m[0].Headers) != 0 {
		t.Fatalf("before an SDK: %d messages, headers %v; want one without headers", len(m), m)
	}
	ack(t, m[0])

	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	push(t, q, queen.Item{Data: []byte("after")})
	if n := len(spanNamed(rec, "send global")); n != 1 {
		t.Fatalf("after installing an SDK: %d send spans, want 1", n)
	}
	m = pop(t, q, queen.PopOptions{})
	if len(m) != 1 || m[0].Headers["traceparent"] == "" {
		t.Fatalf("after installing an SDK: headers %v, want a traceparent", m[0].Headers)
	}
}

// Pop records a client span "receive <queue>" under the caller's, with the
// destination, group, the number of messages it returned and their
// partition when they share one.
func TestTracingPopReceiveSpan(t *testing.T) {
	c, rec, tr := traced(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p1", Data: []byte("a")}, queen.Item{Partition: "p1", Data: []byte("b")})
	ctx, parent := tr.Start(ctxT(t), "parent")
	if m, err := q.Pop(ctx, queen.PopOptions{Group: "g", Batch: 5}); err != nil || len(m) != 2 {
		t.Fatalf("Pop: %d messages, %v", len(m), err)
	}
	push(t, q, queen.Item{Partition: "p2", Data: []byte("c")})
	if m, err := q.Pop(ctx, queen.PopOptions{Group: "g", Partition: "p2"}); err != nil || len(m) != 1 {
		t.Fatalf("Pop p2: %d messages, %v", len(m), err)
	}
	if m, err := q.Pop(ctx, queen.PopOptions{Group: "g"}); err != nil || len(m) != 0 {
		t.Fatalf("Pop of nothing: %d messages, %v", len(m), err)
	}
	parent.End()
	recv := spanNamed(rec, "receive q")
	if len(recv) != 3 {
		t.Fatalf("%d receive spans, want 3", len(recv))
	}
	for i, want := range []struct {
		n    int64
		part string
	}{{2, "p1"}, {1, "p2"}, {0, ""}} {
		s := recv[i]
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindClient ||
			attrOf(s, "messaging.system").AsString() != "queen" || attrOf(s, "messaging.operation.type").AsString() != "receive" ||
			attrOf(s, "messaging.destination.name").AsString() != "q" || attrOf(s, "messaging.consumer.group.name").AsString() != "g" ||
			attrOf(s, "messaging.batch.message_count").AsInt64() != want.n ||
			attrOf(s, "messaging.destination.partition.id").AsString() != want.part || s.Status().Code == codes.Error {
			t.Fatalf("receive span %d: parent %v kind %v status %v attrs %v; want %d messages of partition %q", i,
				s.Parent(), s.SpanKind(), s.Status(), s.Attributes(), want.n, want.part)
		}
	}
}

// A fusion flush records an internal root span "queen.flush" linked to the
// send span of the push call it commits; with the send span not sampled
// there is none.
func TestTracingFlushSpanLinksSendSpans(t *testing.T) {
	c, rec, tr := traced(t)
	ctx, parent := tr.Start(ctxT(t), "parent")
	if _, err := c.Queue("q").Push(ctx, []queen.Item{{Partition: "a"}, {Partition: "b"}, {Partition: "a"}}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	sends, flushes := spanNamed(rec, "send q"), spanNamed(rec, "queen.flush")
	if len(sends) != 1 || len(flushes) == 0 {
		t.Fatalf("%d send and %d flush spans", len(sends), len(flushes))
	}
	var items int64
	for _, f := range flushes {
		if f.SpanKind() != trace.SpanKindInternal || f.Parent().IsValid() || len(f.Links()) != 1 ||
			f.Links()[0].SpanContext.SpanID() != sends[0].SpanContext().SpanID() || f.Status().Code == codes.Error {
			t.Fatalf("flush span: kind %v parent %v links %v status %v", f.SpanKind(), f.Parent(), f.Links(), f.Status())
		}
		items += attrOf(f, "messaging.batch.message_count").AsInt64()
	}
	if items != 3 {
		t.Fatalf("flush spans carried %d items, want 3", items)
	}

	rec2 := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec2), sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c2 := open(t, func(cfg *queen.Config) { cfg.TracerProvider, cfg.Propagator = tp, propagation.TraceContext{} })
	push(t, c2.Queue("q"), queen.Item{Data: []byte("x")})
	if n := len(rec2.Ended()); n != 0 {
		t.Fatalf("%d spans recorded with nothing sampled", n)
	}
}
