package queen_test

import (
	"fmt"
	"testing"

	"github.com/e03140bc/queen"
)

// BenchmarkDecodeClaim decodes one claim of 1000 messages (one pushed
// segment of 200-byte payloads, claimed from PostgreSQL once) per op: the
// client's share of a drain, without the round trip. plain: no key or
// headers, minted transaction ids (the drain benchmark's messages); keyed:
// a key, two headers and a transaction id of the caller's.
func BenchmarkDecodeClaim(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		name := "plain"
		if keyed {
			name = "keyed"
		}
		b.Run(name, func(b *testing.B) {
			c := open(b)
			q := c.Queue("q")
			items := make([]queen.Item, 1000)
			for i := range items {
				data := fmt.Appendf(nil, `{"event":"order.created","id":%d,"customer":"c-%06d","note":"tea"}`, 1_000_000+i, i*7)
				for len(data) < 200 {
					data = append(data, ' ')
				}
				items[i] = queen.Item{Partition: "p", Data: data}
				if keyed {
					items[i].Key = fmt.Sprintf("customer-%d", i%50)
					items[i].TransactionID = fmt.Sprintf("order-%d", i)
					items[i].Headers = map[string]string{"source": "shop", "trace": fmt.Sprintf("t-%d", i)}
				}
			}
			push(b, q, items...)
			rows, err := queen.ClaimRows(ctxT(b), q, "g", len(items))
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				msgs, err := queen.DecodeClaim(q, "g", rows)
				if err != nil {
					b.Fatal(err)
				}
				if len(msgs) != len(items) {
					b.Fatalf("decoded %d messages, want %d", len(msgs), len(items))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/msg")
		})
	}
}
