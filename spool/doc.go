// Package spool is an append-only, crash-safe on-disk log of push records.
// The push path writes to it when PostgreSQL cannot take a push (maintenance
// mode, a failed or timed-out bundle) and reports the items Buffered; a
// background drain replays it through a [ReplayFunc] the caller supplies,
// which pushes through the normal path, and confirms durably, per key, what
// it stored, so a record is offered again only after a crash between its
// storing and that confirmation (each record keeps its transaction id, so
// the queue's deduplication can absorb that). The package knows nothing
// about PostgreSQL. It is a building block of queen
// with no stability promise before v1.
//
// # Contract
//
// An Append that returned nil is on disk (fsynced) and is offered to the
// ReplayFunc until the ReplayFunc stores it and its confirmation is synced:
// at least once, in append order per key, across crashes and restarts of the
// process that owns the directory. A record that fails permanently is set
// aside, not dropped. A crash between storing and confirming offers a record
// again, so the ReplayFunc must be idempotent (queen's is, through the
// transaction id). The spool does not encrypt (callers seal before Append),
// bound how long a record waits, or share a directory between processes.
//
// # Files
//
// Dir holds numbered files, named by a 16-hex-digit sequence number:
//
//	0000000000000007.spool             data: records, append-only
//	0000000000000007.ack               replay progress of that data file
//	0000000000000005.spool.quarantine  a corrupt data file taken out of replay,
//	                                   or records quarantined on their own
//	0000000000000005.ack.quarantine    progress of a quarantined corrupt file
//	LOCK                               flock'ed by the open Spool
//
// Dir must belong to the user running the process and not be writable by
// group or others, and so must every spool file in it (and a symlink, if
// Dir is one); Open refuses anything else with [ErrUnsafeDir] and creates a
// missing Dir 0700. A spool under a shared directory such as /tmp therefore
// never replays records another user put there.
//
// Appends go to one active data file. It is rotated before an Append would
// take it past Options.MaxFileSize (a single larger Append gets a file of
// its own). An Append that would take the spool past Options.MaxTotalSize
// fails with [ErrFull] and writes nothing. Open never appends to a file left
// by a previous run: the first Append after Open starts a new file.
//
// # Byte layout
//
// A data file is an 8-byte header followed by records:
//
//	file header  "QSPL" 0x01 0x00 0x00 0x00        magic, format version 1
//	record       u32 LE  body length n               37 ≤ n ≤ MaxRecordSize
//	             u32 LE  CRC-32C (Castagnoli) of the body
//	             u32 LE  CRC-32C of the 8 bytes above
//	             [n]byte body
//	body         u8      record flags: bit0 = trace id present, bit1 = key
//	                     present, bit2 = lane count present, bit3 = headers
//	                     present, others zero
//	             u8      Record.Flags (the caller's, opaque)
//	             [16]    Record.Tenant
//	             [16]    Record.MessageID
//	             [16]    Record.TraceID, only if bit0 is set (and then non-zero)
//	             uvarint length + bytes  Record.Queue
//	             uvarint length + bytes  Record.Partition
//	             uvarint length + bytes  Record.TransactionID
//	             uvarint length + bytes  Record.Key, only if bit1 is set (and then non-empty)
//	             uvarint Record.Lanes, only if bit2 is set (and then non-zero)
//	             uvarint length + bytes  Record.Headers, only if bit3 is set (and then non-empty)
//	             bytes   Record.Payload: the rest of the body
//
// The header has its own CRC so that a damaged length cannot be mistaken
// for a record that runs past the end of the file (a torn write). Varints
// are minimal and there are no optional encodings, so every valid record
// has exactly one encoding. Overhead per record: 49 bytes plus the names
// and transaction id. The benchmark's record (a 200-byte payload, a 36-byte
// transaction id) takes 293 bytes.
//
// An ack file is a sequence of 12-byte entries, each a u64 LE value and the
// CRC-32C of those 8 bytes, written and synced by Replay. A value with the
// top bit clear is a prefix offset: every record below it is done. A value
// with the top bit set marks the single record starting at the offset in
// its other bits as done (stored, or quarantined on its own). Every entry
// states a fact, so they are only added; reading stops at the first entry
// that does not check out. A missing file or a torn entry only means
// replay repeats more.
//
// # Durability and group commit
//
// When Append returns nil, its records are written and fdatasync'ed, and so
// is the directory entry of the file they are in (a new file's header is
// synced and its directory fsync'ed before any record goes in). A record is
// therefore durable before the push reports Buffered. With [SyncEach] every
// Append does its own write and sync, serialized. With [GroupCommit] a
// single writer goroutine, which Close stops, takes every Append that queued
// while the previous sync ran and commits all of them with one write and
// one sync.
//
// Measured with BenchmarkAppend (one record with a 200-byte payload per
// Append) on the development VM: 2 vCPU, ext4 on a virtual disk, fdatasync
// 0.5–1.7 ms, with other PostgreSQL test clusters loading the machine (load
// average 5–11), so the ranges are wide:
//
//	                   1 appender             64 appenders
//	SyncEach           590–1,790 records/s    600–3,600 records/s    (1 sync per Append)
//	GroupCommit        580–1,600 records/s    13,500–82,000 records/s (0.031 syncs per Append)
//
// On tmpfs, where a sync costs almost nothing, the hand-off to the writer
// costs 1–2.5 µs per Append (3.3–4.2 µs for SyncEach, 5.1–5.9 µs for
// GroupCommit at 1 appender). That is lost in the noise of a real sync,
// while 64 appenders share one sync among about 32 Appends (the waiters
// form two cohorts that alternate) and get 10–25 times SyncEach's
// throughput. GroupCommit is therefore the default. The spool gets
// concurrent appends exactly when it matters: a failed bundle, or
// maintenance mode, sends many pushes at once.
//
// # Crashes: torn tails and corruption
//
// Open scans every data file and validates every record. Only the newest
// data file can end in a torn write: each older one was fully synced before
// its successor was created, and Open cuts a torn tail (and syncs) before
// anything new is written. In the newest file, a record whose header runs
// past the end of the file, a last record whose body fails its CRC, or a
// tail of zero bytes is a torn tail. The records in it were never
// acknowledged, so Open truncates it, logs it and counts it
// (Stats.TornTails). A file whose creation was cut short is removed.
//
// Anything else that is not a valid record is corruption: a bad header CRC
// with data after it, a bad body CRC with records after it, a malformed
// body, or any damage in an older file. The spool never resynchronises past
// it. The records before it are replayed, then the file is quarantined at
// that point (below) and the error is logged and kept in Stats.LastError.
// Replay re-validates every record it reads, so damage that appears after
// Open is handled the same way.
//
// # Replay
//
// [Spool.Replay] makes one pass: oldest file first, in append order, in
// chunks of Options.ReplayBatchRecords and ReplayBatchBytes. Each chunk is
// split by key (tenant, queue, partition), keeping append order within a
// key, and handed to the ReplayFunc one key at a time, up to
// Options.ReplayConcurrency keys at once. Records of one key are never in
// two calls at the same time, and a key's later chunk waits for its earlier
// one, so per-partition order is kept. The ReplayFunc reports how many
// leading records of its batch are stored; as soon as it returns, those
// records are marked done in the file's ack file and synced (calls that
// return meanwhile share the sync). The next pass, whether in this process
// or after a restart, skips them. So a stored record is offered again only
// if the process dies between the ReplayFunc storing it and that sync: at
// most the batches in flight at the crash, one per concurrent call.
//
// A key whose call fails is left alone for the rest of the pass: its
// remaining records stay pending and none of its later records is offered
// before them. The other keys go on, so one partition that cannot take its
// records (a locked row, a poison record) holds up only itself. Calls that
// keep failing with no success in between (2 × ReplayConcurrency in a row,
// as when the database is down) end the pass. A file is deleted once all
// its records are done; the file being appended to is rotated first, so a
// drained spool leaves no files and its bytes stop counting against
// MaxTotalSize. [Spool.Pending] tells whether a key has records not yet
// done, so a caller can queue a key's new records behind them.
//
// Replay reads only synced bytes: a pass takes the active file up to its
// synced size when it gets to it, and Appends may run during a pass.
//
// Errors are classified by the caller. A ReplayFunc wraps an error with
// [Permanent] when retrying cannot help. Any other error is transient: the
// key waits for the next pass, and the caller's loop backs off. When a key
// fails permanently in Options.QuarantineAfter passes (default 3; a stored
// record of the key starts the count again), the record it failed at is
// quarantined on its own: appended (and synced) to this run's
// *.spool.quarantine file, logged, counted in Stats.QuarantinedRecords, and
// marked done; the key goes on with its next record, and while it keeps
// failing permanently each further record it fails at is quarantined at
// once. A corrupt file is quarantined whole (renamed to *.spool.quarantine,
// its ack file to *.ack.quarantine) once every record before the
// corruption is done. A quarantined file is not replayed or counted
// against MaxTotalSize. An operator can re-drive one by renaming it back to
// *.spool (and its ack file, if any, to *.ack) and reopening the spool.
package spool
