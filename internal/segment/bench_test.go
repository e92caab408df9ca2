package segment

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/klauspost/compress/zstd"

	"github.com/e03140bc/queen/dedup"
	"github.com/e03140bc/queen/internal/frame"
)

const benchMsgs = 1000

// payloads returns n JSON-like event bodies of about 200 bytes whose values
// vary the way real events do, so zstd sees realistic redundancy: repeated
// keys and enums, random ids and amounts.
func payloads(n int) [][]byte {
	r := rand.New(rand.NewPCG(42, 42))
	events := []string{"order.created", "order.paid", "order.shipped", "order.cancelled"}
	currencies := []string{"EUR", "USD", "GBP", "CHF"}
	out := make([][]byte, n)
	for i := range out {
		p := fmt.Appendf(nil,
			`{"event":%q,"orderId":"ord-%08d","customerId":%d,"email":"user%d@example.com",`+
				`"amount":%d.%02d,"currency":%q,"items":[{"sku":"SKU-%06X","qty":%d}],`+
				`"ts":"2025-06-%02dT%02d:%02d:%02d.%03dZ","note":"`,
			events[r.IntN(len(events))], r.IntN(1e8), r.IntN(1e6), r.IntN(1e5),
			r.IntN(2000), r.IntN(100), currencies[r.IntN(len(currencies))], r.IntN(1<<24), 1+r.IntN(9),
			1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000))
		for len(p) < 198 {
			p = append(p, "abcdefghijklmnopqrstuvwxyz0123456789"[r.IntN(36)])
		}
		out[i] = append(p, `"}`...)
	}
	return out
}

func benchPools() []struct {
	name string
	pool *pool[*zstd.Encoder]
} {
	return []struct {
		name string
		pool *pool[*zstd.Encoder]
	}{
		{"fastest", encoders},
		{"default", newEncoderPool(zstd.SpeedDefault)},
	}
}

// BenchmarkPushSegment builds a segment the way the push path does: mint an
// id, derive the transaction id and its hash, frame the payload, resolve
// in-flush duplicates, then compress.
func BenchmarkPushSegment(b *testing.B) {
	bodies := payloads(benchMsgs)
	for _, p := range benchPools() {
		b.Run(p.name, func(b *testing.B) {
			var (
				raw, blob []byte
				hashes    = make([]dedup.Hash, 0, benchMsgs)
				leaders   []int
			)
			b.ReportAllocs()
			for b.Loop() {
				raw, hashes = raw[:0], hashes[:0]
				for i := range benchMsgs {
					id, err := uuid.NewV7()
					if err != nil {
						b.Fatal(err)
					}
					txn := id.String()
					hashes = append(hashes, dedup.Sum(txn))
					raw = frame.Append(raw, &frame.Frame{ID: id, TransactionID: txn, Payload: bodies[i]})
				}
				leaders = dedup.Leaders(hashes, leaders)
				blob = compress(p.pool, blob[:0], raw)
			}
			b.ReportMetric(float64(b.N*benchMsgs)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(len(raw))/float64(len(blob)), "ratio")
			b.ReportMetric(float64(len(blob))/benchMsgs, "B/msg")
		})
	}
}

func benchSegment() []byte {
	var raw []byte
	for _, p := range payloads(benchMsgs) {
		id := uuid.Must(uuid.NewV7())
		raw = frame.Append(raw, &frame.Frame{ID: id, TransactionID: id.String(), Payload: p})
	}
	return raw
}

func BenchmarkCompress(b *testing.B) {
	raw := benchSegment()
	for _, p := range benchPools() {
		b.Run(p.name, func(b *testing.B) {
			var blob []byte
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				blob = compress(p.pool, blob[:0], raw)
			}
			b.ReportMetric(float64(b.N*benchMsgs)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(len(raw))/float64(len(blob)), "ratio")
		})
	}
}

func BenchmarkDecompress(b *testing.B) {
	raw := benchSegment()
	blob := Compress(nil, raw)
	out := make([]byte, 0, len(raw))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if out, err = Decompress(out[:0], blob); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchMsgs)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkSegmentSizes compresses segments of 10 to 1000 messages with
// and without entropy coding of literals (what Compress picks below and
// above SmallBlock), reporting the cost per message and the ratio.
func BenchmarkSegmentSizes(b *testing.B) {
	for _, n := range []int{10, 50, 200, 1000} {
		var raw []byte
		for _, p := range payloads(n) {
			id := uuid.Must(uuid.NewV7())
			raw = frame.Append(raw, &frame.Frame{ID: id, TransactionID: id.String(), Payload: p})
		}
		for _, c := range []struct {
			name string
			pool *pool[*zstd.Encoder]
		}{{"entropy", encoders}, {"no-entropy", smallEncoders}} {
			b.Run(fmt.Sprintf("%d-msgs/%s", n, c.name), func(b *testing.B) {
				var blob []byte
				for b.Loop() {
					blob = compress(c.pool, blob[:0], raw)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
				b.ReportMetric(float64(len(blob))/float64(len(raw)), "size/raw")
			})
		}
	}
}
