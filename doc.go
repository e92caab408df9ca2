// Package queen is an embeddable, PostgreSQL-backed, partitioned message log.
//
// Import it, call [Open] with a database URL, and push to and consume from
// queues: there is no broker to run. Everything lives in one PostgreSQL
// schema ([Config.Schema], "queen" by default), created and migrated by
// Open.
//
// # Lifecycle
//
//	client, err := queen.Open(ctx, queen.Config{DatabaseURL: url}) // connect, migrate, start
//	defer client.Close(ctx)                                         // flush, stop
//
//	orders := client.Queue("orders") // a handle; the first push creates the queue
//	res, err := orders.Push(ctx, []queen.Item{{Partition: "customer-42", Data: data}})
//
//	msgs, err := orders.Pop(ctx, queen.PopOptions{Batch: 10}) // claim under a lease
//	err = msgs[len(msgs)-1].Ack(ctx)                          // commit the cursor through it
//
//	// Or let Consume pop, ack and fail for you:
//	err = orders.Consume(ctx, queen.ConsumeOptions{Concurrency: 4},
//		func(ctx context.Context, m *queen.Message) error { return handle(m) })
//
// [Open] connects, applies the embedded migrations and starts the engine.
// [Client.Queue] returns a cheap handle; [Queue.Configure] sets a queue's
// options ([QueueOptions]), and a first push creates the queue with the
// defaults. [Queue.Push] stores items ([Item]) and reports one [PushResult] per
// item. [Queue.Pop] claims messages under a lease; [Message.Ack],
// [Message.Fail], [Message.Retry], [Message.DeadLetter] and
// [Message.ExtendLease] settle or keep them. [Queue.Consume] runs that loop
// for you with a handler: nil acks, an error fails. [Client.Close] stops
// intake, flushes, stops running Consume calls and every goroutine the
// client started.
//
// # Concepts
//
// A queue is a set of partitions, named per tenant ([Client.WithTenant]).
//
// A partition is an ordered lane and the unit of order and of leasing. Each
// message gets an offset in its partition: 0, 1, 2, … without gaps, in
// commit order. An [Item] with no Partition goes to [DefaultPartition].
// Partitions are created by their first push; a queue may have hundreds of
// thousands of them. A partition left empty and unwritten for
// [MaintenanceConfig.IdlePartition] is forgotten, and its offsets start at
// 0 again if it is pushed to later.
//
// A key ([Item.Key]) is an ordering key inside a partition. An item with a
// Key and no Partition goes to one of the queue's keyed lanes, the
// partitions "lane-0" … "lane-<Lanes-1>" chosen by a hash of the key
// ([QueueOptions.Lanes], [DefaultLanes]): every message of a key shares its
// lane and keeps its order, however many keys there are. [Message.Key]
// tells the consumer the key; [ConsumeOptions.KeyConcurrency] handles
// different keys of one partition in parallel, each key in order.
//
// A consumer group ([PopOptions.Group]) has its own cursor per partition:
// each group reads every message (fan-out), starting where its
// [Subscription] says. The empty group is queue mode: competing consumers
// share one cursor per partition.
//
// A lease: a pop claims a batch of a partition for its group, and until
// the lease ends ([QueueOptions.LeaseTime], 5 minutes by default) no other
// consumer of that group gets that partition's messages, so a partition is
// processed in order by one holder at a time. Acking a message commits the
// cursor through it (the lease's earlier messages complete with it); the
// lease ends when its last message is settled, or expires and the
// messages are redelivered to the next holder. [Queue.Consume] renews it
// while a handler runs.
//
// A transaction id ([Item.TransactionID], by default the message's own
// UUIDv7 id) is the idempotency key, per partition. A repeat inside one Push
// call or one flush is always stored once and reported [Duplicate] with
// the original message's id; with the queue's [QueueOptions.DedupWindow]
// so is a push repeating a transaction id stored in the same partition
// within the window (for an item routed by its Key, its lane).
//
// The spool: when PostgreSQL cannot take a push (down, in maintenance mode
// via [Client.SetMaintenance], pool exhausted, statement timeout), the
// items are written and fsynced to a local disk spool ([Config.SpoolDir])
// and reported [Buffered]; a drain replays them with their original ids
// once PostgreSQL is back. [Client.SpoolStats] shows its depth.
//
// # Guarantees
//
// What queen promises, and nothing more:
//
//   - [Queued] means committed: the message is in its partition at the
//     reported offset.
//   - [Buffered] means fsynced to the local spool before Push returned
//     (within about [Config.StatementTimeout] even with the database
//     unreachable), and replayed with the original message and transaction
//     ids, each stored once. Two windows can store a replayed item twice:
//     the process dying between the replay's commit and its confirmation,
//     and a statement timeout racing the commit; a DedupWindow absorbs both.
//   - Per partition, one client's pushes are stored in push order: a Push
//     that returned before the next began is stored first, and pushes to a
//     partition with spooled items are spooled behind them. [Queue.PushTx]
//     and [Client.Tx] are never spooled and can overtake spooled items.
//   - [Failed] means not stored. A Push that returns an error (its context
//     ended, the client closed) may or may not have stored what the engine
//     already held: push again with the same transaction ids on a queue
//     with a DedupWindow to find out.
//   - Consumption is at-least-once with explicit acks: a message is
//     redelivered until it is acked, dead-lettered or, under
//     [FailureSkip], re-enqueued. With [PopOptions.AutoAck] it is
//     at-most-once: messages a process popped and did not handle are lost.
//   - A settlement ([Message.Ack], Fail, Retry, DeadLetter, AckBatch,
//     Consume's) returns once committed or refused. Its context does not
//     cancel it, even when it commits alone on the calling goroutine
//     (nothing else of its fusion shard pending or in flight): it runs to
//     completion within [Config.StatementTimeout], so a stopping consumer
//     still commits what it handled.
//   - [Message.Fail] charges the queue's [QueueOptions.RetryLimit]; the
//     failure that spends it dead-letters the message (with
//     [QueueOptions.DeadLetter], else drops it). Lease expiry and Retry
//     never charge. Under [FailurePause] (the default) later messages of
//     the partition wait for the failed one.
//   - Undecodable messages (a corrupt segment, a payload that does not
//     decrypt under the key that sealed it) are dead-lettered on their own,
//     never skipped unseen, and never block their partition. A client
//     that lacks the key a claimed payload names takes nothing: its Pop or
//     Consume fails with [ErrEncryption].
//   - Encrypted queues ([QueueOptions.Encryption]) never reach disk in
//     plaintext, spool included.
//   - Retention deletes what it is told to: [QueueOptions.Retention] whether
//     read or not, [QueueOptions.CompletedRetention] only what every
//     subscribed group has consumed.
//
// # Atomicity
//
// [Queue.PushTx] pushes inside your own pgx transaction: the messages exist
// if and only if you commit (the outbox pattern; [Queued] then means
// "queued if you commit"). [Client.Tx] acks and
// pushes atomically: "ack this, push that" happens whole or not at all.
//
// # Examples
//
// The package example opens a client, pushes, pops and acks. [Queue.Consume]
// has examples of a consumer and of graceful shutdown on SIGTERM;
// [Client.Tx], [Queue.PushTx] and [Queue.DeadLetters] have one each;
// [QueueOptions] has the dedup window and the retry limit, and
// [ConsumeOptions] keyed lanes with KeyConcurrency. Each runs as a test
// against a real PostgreSQL. The repository's examples/ directory holds
// runnable programs (examples/quickstart first).
package queen
