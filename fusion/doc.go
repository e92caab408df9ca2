// Package fusion is the scheduling engine of the push path: it accumulates
// work per partition and commits many partitions in one flush, so that one
// database transaction carries the writes of many concurrent requests.
//
// The package knows nothing about SQL. The caller supplies a [FlushFunc] that
// commits a bundle of [Batch] values (one per partition) and writes each
// item's verdict into the item itself. It is a building block of queen with
// no stability promise before v1.
//
// # Contract
//
// An Engine promises, for every key: flushes never overlap; items reach the
// FlushFunc in submission order, and items a flush puts in Batch.Retry come
// back first in the next one; every submitted item is resolved exactly once,
// by the flush that carried it or by Close's abandon, and only then is its
// submission done. Memory is bounded by Config.MaxBuffered per shard and
// Config.MaxBufferedBytes overall: Submit waits for room or its context.
//
// It does not promise order across keys, does not retry or judge a flush
// (the FlushFunc writes each verdict; an error only feeds the limiter), keeps
// nothing durable (a process that dies loses what it holds), and knows
// nothing of queues, SQL or tenants: keys are any comparable type with a hash.
//
// # Shards and keys
//
// Work is keyed by a [Keyer] type: any comparable type with a hash (queen
// keys pushes by tenant, queue and partition). A key hashes to one of
// Config.Shards shards, and each shard owns the state of its keys in a
// single goroutine: arrivals and flush completions reach it over channels,
// so that state needs no locks. The shard finds a key's state by the hash
// (keys that share one are told apart by ==), and hands it to the FlushFunc
// as Batch.Hash.
//
// # Life of a key
//
// Inside a shard every key is in one of four states:
//
//	idle ──arrival──▶ ready ──dispatch──▶ in flight ──flush returned──▶ idle
//	                    ▲                    │  │
//	                    │                    │  └─ arrivals accumulate in the
//	                    └── pending ≠ ∅ ◀────┘     key's pending queue
//
// An idle key holds nothing and is forgotten. A ready key has pending items
// and no flush in flight; ready keys wait in a FIFO. Dispatch moves up to
// Config.BundleMax ready keys into one FlushFunc call, each as a segment
// holding everything that accumulated for it since its last dispatch. While a
// key is in flight its new arrivals accumulate and are dispatched only after
// the previous FlushFunc returned, so flushes of one key never overlap and a
// key's items are flushed in submission order. Items the flush put in
// Batch.Retry go back to the head of the key's pending queue.
//
// # When a shard dispatches
//
// There is no batching window. A shard dispatches whenever an arrival or a
// completion finds ready keys, fewer than Config.MaxInFlight bundles in flight
// and a push permit immediately available from the shared [Vegas] limiter
// (fire-on-idle): an isolated submission is flushed with no added delay. When
// no permit is free the lane is contended, so work keeps accumulating and the
// next freed permit fires a larger bundle; bundle size follows load. A shard
// refused a permit queues at the limiter ([Vegas.Acquire]), and freed permits
// go to queued shards in the order they were refused, each woken in turn:
// otherwise the shard that happens to receive an item first takes the permit
// and fires a bundle of one while shards holding a backlog starve (measured
// with 1000 pushers over 100k keys: half the bundles carried one segment).
// Config.Hold is only a backstop tick for permits freed in ways the engine
// cannot see.
//
// # Inline flushes
//
// Even with no batching window, an isolated submission crosses three
// goroutines (submitter, shard, flush goroutine, and back to the waiting
// submitter), each a wake-up that on a small virtual machine costs about as
// much as the database's own work for one row. With Config.Inline,
// [Engine.SubmitWait] of a single key runs the FlushFunc on the caller's
// goroutine, with a bundle of that one key, when the key's shard is idle:
// nothing pending, nothing in flight, no arrival on its way, no other
// inline flush, no shard queued at the limiter, and a permit free at once
// (otherwise the submission takes the shard's path). The flush carries the
// caller's items only, never another submitter's.
//
// The shard's goroutine learns of an inline flush only on its own
// idle→active edge: an arrival (or Close) meanwhile finds the inline key
// and holds it as in flight, so the key's arrivals wait behind the flush
// and the shard's other keys dispatch beside it (the inline flush counts
// toward Config.MaxInFlight). When the flush returns, its key goes back to
// the shard, as a completion, only if the shard held it or the flush put
// items in Batch.Retry, which then go to the head of the key's pending
// queue; otherwise the shard hears nothing. Everything in the Contract
// holds for inline flushes: they take a permit and give it back with their
// round trip, count toward MaxBufferedBytes, are waited for by Close (and
// their retried items abandoned if Close's ctx ends), and resolve each
// item once.
//
// Cancellation differs. A shard's flush carries many submitters' items, so
// it runs on the engine's FlushContext and a submitter who gives up only
// stops waiting. An inline flush carries its caller's items only, and the
// caller cannot stop waiting while running it, so it does what a single
// INSERT does: it runs on FlushContext (the engine's timeout) and is also
// cancelled when the caller's ctx ends, with [ErrCallerGone] as the
// context's cause. SubmitWait then returns ctx.Err() and the outcome is
// unknown to the caller: the flush may have committed or not. The
// FlushFunc resolves the items (as failed, normally) and must not take the
// cancellation for a database failure; the limiter gets its permit back
// without a round-trip sample. Submit never flushes inline.
//
// # Push permits: the Vegas limiter
//
// [Vegas] bounds the number of bundles in flight across all shards, adapting
// the bound the way TCP Vegas adapts a congestion window. It tracks rttNoLoad,
// the minimum flush round trip over the last one to two windows of
// VegasConfig.Window samples (so the baseline can follow a change such as a
// database failover), and on every release estimates the queue the database
// is building:
//
//	queue = limit × (1 − rttNoLoad / rtt)
//
// If queue < Alpha (default 2) the database keeps up and the limit grows by
// one, provided at least half the permits were in use (an idle lane proves
// nothing). If queue > Beta (default 4) requests are queueing and the limit
// shrinks by one. A failed flush halves it. The limit stays within
// [Min, Max] (default [1, 64]) and starts at Initial (default 4).
package fusion
