package citus

// SplitByGroup groups items by the worker group groupOf names for each,
// in the order the groups are first seen and keeping the items' order
// within a group; items whose group is not known form a part of their
// own. It returns nil when every item falls in one part: nothing to split.
func SplitByGroup[T any](items []T, groupOf func(T) (group int32, known bool)) [][]T {
	type part struct {
		group int32
		known bool
		items []T
	}
	var parts []part
	for _, it := range items {
		g, known := groupOf(it)
		i := 0
		for i < len(parts) && (parts[i].known != known || parts[i].group != g) {
			i++
		}
		if i == len(parts) {
			parts = append(parts, part{group: g, known: known})
		}
		parts[i].items = append(parts[i].items, it)
	}
	if len(parts) < 2 {
		return nil
	}
	out := make([][]T, len(parts))
	for i, pt := range parts {
		out[i] = pt.items
	}
	return out
}
