package sqlschema_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

// The helpers that hold one rule each for several callers, called directly.
func TestSharedRuleHelpers(t *testing.T) {
	ctx := ctxT(t)
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	s := pgx.Identifier{schema}.Sanitize()

	t.Run("lag_messages", func(t *testing.T) {
		for _, c := range []struct{ last, comm, start, want int64 }{
			{9, 4, 0, 5},   // plain lag
			{9, 9, 0, 0},   // caught up
			{9, 2, 6, 4},   // retention deleted 3..5 unread: not lag
			{9, -1, 10, 0}, // everything deleted
			{-1, -1, 0, 0}, // nothing pushed
		} {
			var got int64
			if err := pool.QueryRow(ctx, "SELECT "+s+".lag_messages($1, $2, $3)", c.last, c.comm, c.start).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("lag_messages(%d, %d, %d) = %d, want %d", c.last, c.comm, c.start, got, c.want)
			}
		}
	})

	t.Run("lease_after", func(t *testing.T) {
		var end *int64
		var owner *string
		var exp *time.Time
		if err := pool.QueryRow(ctx, "SELECT batch_end, lease_owner, lease_expires_at FROM "+s+
			".lease_after(true, 7, gen_random_uuid(), 'o', now())").Scan(&end, &owner, &exp); err != nil {
			t.Fatal(err)
		}
		if end != nil || owner != nil || exp != nil {
			t.Errorf("released lease kept %v %v %v", end, owner, exp)
		}
		for _, rel := range []*bool{new(bool), nil} { // false and NULL keep it
			if err := pool.QueryRow(ctx, "SELECT batch_end, lease_owner, lease_expires_at FROM "+s+
				".lease_after($1, 7, gen_random_uuid(), 'o', now())", rel).Scan(&end, &owner, &exp); err != nil {
				t.Fatal(err)
			}
			if end == nil || *end != 7 || owner == nil || *owner != "o" || exp == nil {
				t.Errorf("kept lease (release %v) lost its columns: %v %v %v", rel, end, owner, exp)
			}
		}
	})

	t.Run("retention_due", func(t *testing.T) {
		old := time.Now().Add(-time.Hour)
		young := time.Now()
		hour := time.Hour.Milliseconds()
		keepFrom := old.Add(time.Minute)
		for _, c := range []struct {
			name      string
			created   *time.Time
			end       int64
			ret, done int64
			groups    bool
			committed *int64
			keepFrom  *time.Time
			want      bool
		}{
			{"both off", &old, 0, 0, 0, true, nil, nil, false},
			{"retention, old", &old, 0, 1, 0, false, nil, nil, true},
			{"retention, young", &young, 0, hour, 0, false, nil, nil, false},
			{"completed, no group", &old, 0, 0, 1, false, nil, nil, false},
			{"completed, groups open", &old, 0, 0, 1, true, nil, nil, true},
			{"completed, read", &old, 3, 0, 1, true, ptr(int64(3)), nil, true},
			{"completed, unread", &old, 4, 0, 1, true, ptr(int64(3)), nil, false},
			{"completed, still needed", &old, 0, 0, 1, true, nil, &old, false},
			{"completed, needed from later", &old, 0, 0, 1, true, nil, &keepFrom, true},
			{"retention beats an unread cursor", &old, 4, 1, 1, true, ptr(int64(3)), nil, true},
			{"no segment", nil, 0, 1, 1, true, nil, nil, false},
		} {
			var got *bool
			if err := pool.QueryRow(ctx, "SELECT "+s+".retention_due($1, $2, $3, $4, clock_timestamp(), $5, $6, $7)",
				c.created, c.end, c.ret, c.done, c.groups, c.committed, c.keepFrom).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if (got != nil && *got) != c.want {
				t.Errorf("%s: retention_due = %v, want %v", c.name, got, c.want)
			}
		}
	})
}

func ptr[T any](v T) *T { return &v }
