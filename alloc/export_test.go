package alloc

// Wire is the write buffer the Bundle lends to a connection's frontend.
func (b *Bundle) Wire() []byte { return b.wire }

// Aliases reports whether a and b share their backing array.
func Aliases(a, b []byte) bool { return aliases(a, b) }

// Probe is a protocol message of no bytes that records the frontend's
// write buffer as its encoding sees it.
type Probe struct{ Buf *[]byte }

func (Probe) Frontend()           {}
func (Probe) Decode([]byte) error { return nil }
func (p Probe) Encode(dst []byte) ([]byte, error) {
	*p.Buf = dst
	return dst, nil
}
