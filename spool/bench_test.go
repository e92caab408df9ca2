package spool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gofrs/uuid/v5"
)

// BenchmarkAppend compares SyncEach and GroupCommit with 1 and 64 concurrent
// appenders, each Append one record with a 200-byte payload (293 bytes on
// disk). One op is one Append. SPOOL_BENCH_DIR selects the file system
// (default: the test temp dir); fsync on tmpfs measures nothing.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []SyncMode{SyncEach, GroupCommit} {
		for _, appenders := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/appenders=%d", mode, appenders), func(b *testing.B) {
				dir := b.TempDir()
				if d := os.Getenv("SPOOL_BENCH_DIR"); d != "" {
					var err error
					if dir, err = os.MkdirTemp(d, "spoolbench"); err != nil {
						b.Fatal(err)
					}
					defer os.RemoveAll(dir)
				}
				s, err := Open(Options{Dir: dir, Sync: mode, MaxTotalSize: 1 << 40, Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				r := Record{
					Tenant: testTenant, Queue: "orders", Partition: "p0",
					TransactionID: "0195b6f4-7d3a-7c1e-9a51-4f0b2f6f9c10",
					MessageID:     uuid.Must(uuid.NewV7()),
					Payload:       bytes.Repeat([]byte("x"), 200),
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for range appenders {
					wg.Go(func() {
						recs := []Record{r}
						for next.Add(1) <= int64(b.N) {
							if err := s.Append(context.Background(), recs); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				st := s.Stats()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
				b.ReportMetric(float64(st.Fsyncs)/float64(b.N), "syncs/op")
			})
		}
	}
}
