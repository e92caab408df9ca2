package stmt

import (
	"context"

	"github.com/e03140bc/queen/alloc"
)

// The push statements take an alloc.Bundle (the segments' parallel arrays,
// reused across calls) and answer one alloc.Verdict per segment; alloc
// binds their parameters and scans their columns. These functions pair
// each with its statement, so no caller hands alloc a statement text.

// PushBundle runs s.PushBundle for b on q and fills out with one verdict
// per segment, in input order (see alloc.Bundle.Push).
func PushBundle(ctx context.Context, s *Set, q alloc.Querier, b *alloc.Bundle, out []alloc.Verdict) ([]alloc.Verdict, error) {
	return b.Push(ctx, q, s.PushBundle, out)
}

// PushSegment runs s.PushSegment for b, exactly one segment to a partition
// known to exist; the verdict may be alloc.NeedsBundle (see
// alloc.Bundle.PushSegment).
func PushSegment(ctx context.Context, s *Set, q alloc.Querier, b *alloc.Bundle, out []alloc.Verdict) ([]alloc.Verdict, error) {
	return b.PushSegment(ctx, q, s.PushSegment, out)
}

// AppendSegment runs s.AppendSegment for b, exactly one segment to a
// partition known to exist, whose id is pid, of a queue without a dedup
// window; the verdict may be alloc.NeedsBundle (see
// alloc.Bundle.AppendSegment). A previous release's statements (see Use)
// lack it: then PushSegment, which that release ran instead.
func AppendSegment(ctx context.Context, s *Set, q alloc.Querier, b *alloc.Bundle, pid int64, out []alloc.Verdict) ([]alloc.Verdict, error) {
	if s.AppendSegment == "" {
		return b.PushSegment(ctx, q, s.PushSegment, out)
	}
	return b.AppendSegment(ctx, q, s.AppendSegment, pid, out)
}

// SegmentAt runs s.SegmentAt: the segment covering offset off of
// partition pid; found is false when retention removed it.
func SegmentAt(ctx context.Context, s *Set, q alloc.Querier, pid, off int64) (seg alloc.CoveringSegment, found bool, err error) {
	return alloc.SegmentAt(ctx, q, s.SegmentAt, pid, off)
}
