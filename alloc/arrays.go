package alloc

import "github.com/jackc/pgx/v5/pgtype"

// array is a slice bound as a PostgreSQL array. pgx binds a plain slice
// element by element through an interface, which boxes (allocates) each
// element, and a [][]byte through reflection besides; array hands pgx a
// pointer to each element instead, which boxes for free, and pgx encodes
// what it points to as it would the element. A bundle binds about ten
// elements per segment, up to 256 segments a call.
type array[T any] []T

// Dimensions is one dimension of len(a) elements; nil (NULL) for a nil a.
func (a array[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index is a pointer to element i.
func (a array[T]) Index(i int) any { return &a[i] }

// IndexType is the type Index returns.
func (a array[T]) IndexType() any { return (*T)(nil) }
