package queen_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// CPU per message of the consume path on a cluster of its own (the server's
// CPU from /proc, this process's from getrusage), for A/B comparisons of
// the function layer on a shared machine, where rates are noise:
//
//	go test -run x -bench ConsumeCPU -benchtime 20000x -count 3 .
//
// PopAck: pops of 10 over 10 partitions, each message acked alone (fused
// acks: ack_many). Consume: one worker, batches of 10, the lingering
// lease (linger_ack, pop_linger, pop_ahead).
func BenchmarkConsumeCPU(b *testing.B) {
	cl := pgtest.NewCluster(b, pgcluster.Production())
	ctx := context.Background()
	for _, mode := range []string{"PopAck", "Consume"} {
		b.Run(mode, func(b *testing.B) {
			c, err := queen.Open(ctx, queen.Config{DatabaseURL: cl.URL, Schema: "bench", Logger: quietLogger(), SpoolDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			q := c.Queue(fmt.Sprintf("cpu_%s_%d", mode, time.Now().UnixNano()))
			const parts = 10
			per := max(b.N/parts, 1)
			for p := range parts {
				for left := per; left > 0; {
					n := min(left, 1000)
					items := make([]queen.Item, n)
					for i := range items {
						items[i] = queen.Item{Data: benchPayload, Partition: fmt.Sprint("p", p)}
					}
					if _, err := q.Push(ctx, items); err != nil {
						b.Fatal(err)
					}
					left -= n
				}
			}
			total := int64(per * parts)
			p0, s0 := processCPU(), serverCPU(cl.Pid())
			b.ResetTimer()
			var n atomic.Int64
			switch mode {
			case "PopAck":
				for n.Load() < total {
					msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 10})
					if err != nil {
						b.Fatal(err)
					}
					for _, m := range msgs {
						if err := m.Ack(ctx); err != nil {
							b.Fatal(err)
						}
						n.Add(1)
					}
				}
			case "Consume":
				cctx, cancel := context.WithCancel(ctx)
				err := q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 50 * time.Millisecond}},
					func(context.Context, *queen.Message) error {
						if n.Add(1) >= total {
							cancel()
						}
						return nil
					})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric((serverCPU(cl.Pid())-s0)/float64(total)*1e6, "server_cpu_µs/msg")
			b.ReportMetric((processCPU()-p0)/float64(total)*1e6, "client_cpu_µs/msg")
		})
	}
}
