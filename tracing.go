package queen

import (
	"context"
	"maps"
	"reflect"
	"slices"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/e03140bc/queen/fusion"
)

const tracerName = "github.com/e03140bc/queen"

// idleGlobal is OpenTelemetry's global tracer provider as it is before an
// application installs one: a delegate that records nothing until
// otel.SetTracerProvider, after which otel.GetTracerProvider returns the
// installed provider instead. Nil if something installed a recording
// provider before this package was initialised.
var idleGlobal = func() trace.TracerProvider {
	tp := otel.GetTracerProvider()
	_, span := tp.Tracer(tracerName).Start(context.Background(), "probe")
	defer span.End()
	if span.IsRecording() {
		return nil
	}
	return tp
}()

// tracing reports whether spans may record: false while the client uses the
// global provider and no SDK has been installed, so pushes then cost what
// they cost without tracing (a non-recording span still allocates).
func (e *engine) tracing() bool {
	return e.tracer != nil && (!e.viaGlobal || otel.GetTracerProvider() != idleGlobal)
}

// tracerOf is the tracer of tp, or nil when tp is a no-op provider: then
// no span is started and no header injected.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	// The trace package's own no-op provider is deprecated, but a caller
	// may still pass one; known by its type, without calling the
	// deprecated constructor.
	if rt := reflect.TypeOf(tp); rt != nil && rt.PkgPath() == "go.opentelemetry.io/otel/trace" && rt.Name() == "noopTracerProvider" {
		return nil
	}
	return tp.Tracer(tracerName)
}

// startSend starts the producer span of one push call of n items to queue
// and returns ctx with it (sendSpan finds it there) and the items to push:
// with tracing on, copies whose headers carry the span's context (the
// caller's own headers win on a name clash), else items unchanged. end
// finishes the span with the call's error.
func (e *engine) startSend(ctx context.Context, queue string, items []Item) (context.Context, []Item, func(error)) {
	if len(items) == 0 || !e.tracing() {
		return ctx, items, endNothing
	}
	ctx, span := e.tracer.Start(ctx, "send "+queue, trace.WithSpanKind(trace.SpanKindProducer))
	recording := span.IsRecording()
	if !recording && !e.injects {
		// The global provider without an SDK behind it: nothing would be
		// recorded or carried, so the push path stays as without tracing.
		return ctx, items, endNothing
	}
	if recording {
		span.SetAttributes(
			attribute.String("messaging.system", "queen"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", queue),
			attribute.Int("messaging.batch.message_count", len(items)),
		)
	}
	if e.injects {
		carrier := propagation.MapCarrier{}
		e.prop.Inject(ctx, carrier)
		if len(carrier) > 0 {
			out := make([]Item, len(items))
			for i, it := range items {
				h := make(map[string]string, len(it.Headers)+len(carrier))
				maps.Copy(h, carrier)
				maps.Copy(h, it.Headers)
				it.Headers = h
				out[i] = it
			}
			items = out
		}
	}
	return ctx, items, func(err error) { endSpan(span, err) }
}

// sendSpan is the recording send span startSend put in ctx, or nil: what
// a flush span links to.
func (e *engine) sendSpan(ctx context.Context) trace.Span {
	if !e.tracing() {
		return nil
	}
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		return s
	}
	return nil
}

// MaxFlushLinks caps the links of a fusion flush span "queen.flush" to the
// send spans of the push calls whose items it commits: a bundle may carry
// thousands of calls. The first MaxFlushLinks distinct recording send spans
// in bundle order are linked.
const MaxFlushLinks = 32

// startFlush starts the internal span of one fusion flush, a root linked to
// the recording send spans of its items' push calls (at most
// MaxFlushLinks), when there is one; end finishes it with the flush's
// error.
func (e *engine) startFlush(ctx context.Context, bundle []*fusion.Batch[partitionKey, *pushItem]) (context.Context, func(error)) {
	if !e.tracing() {
		return ctx, endNothing
	}
	var (
		links []trace.Link
		last  trace.Span
		items int
	)
	for _, b := range bundle {
		items += len(b.Items)
		for _, it := range b.Items {
			// A call's items share its span: compare with the last first.
			if it.send == nil || it.send == last || len(links) == MaxFlushLinks {
				continue
			}
			last = it.send
			if !last.IsRecording() {
				continue // the caller gave up and its span ended
			}
			sc := last.SpanContext()
			if !slices.ContainsFunc(links, func(l trace.Link) bool { return l.SpanContext.SpanID() == sc.SpanID() }) {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
	}
	if len(links) == 0 {
		return ctx, endNothing
	}
	ctx, span := e.tracer.Start(ctx, "queen.flush", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(links...), trace.WithAttributes(
			attribute.String("messaging.system", "queen"),
			attribute.Int("messaging.batch.message_count", items),
			attribute.Int("queen.flush.partitions", len(bundle)),
		))
	return ctx, func(err error) { endSpan(span, err) }
}

// startReceive starts the client span of one Pop call on queue, child of
// ctx's span; end finishes it with the messages Pop returns and its error.
func (e *engine) startReceive(ctx context.Context, queue string, o *PopOptions) (context.Context, func([]*Message, error)) {
	ctx, span := e.tracer.Start(ctx, "receive "+queue, trace.WithSpanKind(trace.SpanKindClient))
	if !span.IsRecording() {
		return ctx, func([]*Message, error) {}
	}
	span.SetAttributes(
		attribute.String("messaging.system", "queen"),
		attribute.String("messaging.operation.name", "receive"),
		attribute.String("messaging.operation.type", "receive"),
		attribute.String("messaging.destination.name", queue),
		attribute.String("messaging.consumer.group.name", o.Group),
	)
	part := o.Partition
	return ctx, func(msgs []*Message, err error) {
		span.SetAttributes(attribute.Int("messaging.batch.message_count", len(msgs)))
		if part == "" && len(msgs) > 0 && !slices.ContainsFunc(msgs, func(m *Message) bool { return m.Partition != msgs[0].Partition }) {
			part = msgs[0].Partition
		}
		if part != "" {
			span.SetAttributes(attribute.String("messaging.destination.partition.id", part))
		}
		endSpan(span, err)
	}
}

func endNothing(error) {}

// startProcess starts the consumer span of one handled message, child of
// the message's creation context (the producer span it was pushed under) or
// a root when it carries none, and returns the handler's context with it
// and the function that ends it with the handler's error.
func (e *engine) startProcess(ctx context.Context, m *Message) (context.Context, func(error)) {
	// Not a child of whatever span Consume's context carries: one long
	// consumer would otherwise gather every message into one trace.
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	if len(m.Headers) > 0 {
		ctx = e.prop.Extract(ctx, propagation.MapCarrier(m.Headers))
	}
	ctx, span := e.tracer.Start(ctx, "process "+m.Queue, trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return ctx, endNothing
	}
	span.SetAttributes(
		attribute.String("messaging.system", "queen"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", m.Queue),
		attribute.String("messaging.destination.partition.id", m.Partition),
		attribute.String("messaging.consumer.group.name", m.Group),
		attribute.String("messaging.message.id", m.ID.String()),
		attribute.Int64("messaging.queen.offset", m.Offset),
	)
	return ctx, func(err error) { endSpan(span, err) }
}

// endSpan ends span, with error status and error.type when err is not
// nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetAttributes(attribute.String("error.type", errorType(err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// ContextFrom returns ctx carrying the trace context m was pushed with (its
// creation context, extracted from m.Headers by Config.Propagator), for
// callers of Pop who start their own spans; Consume does this itself. With
// no trace context in m.Headers it returns ctx unchanged.
func ContextFrom(ctx context.Context, m *Message) context.Context {
	if m == nil || len(m.Headers) == 0 {
		return ctx
	}
	var prop propagation.TextMapPropagator
	if m.q != nil {
		prop = m.q.c.e.prop
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	return prop.Extract(ctx, propagation.MapCarrier(m.Headers))
}
