package sqlschema_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/pgtest"
)

// The helpers that hold one rule each for several callers, called directly.
func TestSharedRuleHelpers(t *testing.T) {
	ctx, pool, schema := migrated(t)
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

	// lag_unsettled against the count it replaced (a subquery over the
	// settled array), over every small cursor, start, head and settled set.
	t.Run("lag_unsettled", func(t *testing.T) {
		var bad int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM (
    SELECT c.comm, l.start, h.last, st.settled
    FROM generate_series(-1, 5) c(comm), generate_series(0, 6) l(start), generate_series(-1, 6) h(last),
         (SELECT NULL::bigint[] UNION ALL SELECT '{}' UNION ALL SELECT '{2}' UNION ALL SELECT '{1,3}'
          UNION ALL SELECT '{3,4,6}' UNION ALL SELECT '{0,2,5,7}') st(settled)) x
WHERE `+s+`.lag_unsettled(x.last, x.comm, x.start, x.settled) IS DISTINCT FROM
      `+s+`.lag_messages(x.last, x.comm, x.start)
        - (SELECT count(*) FROM unnest(x.settled) AS u(o)
           WHERE u.o > greatest(x.comm, x.start - 1) AND u.o <= x.last)`).Scan(&bad); err != nil {
			t.Fatal(err)
		}
		if bad != 0 {
			t.Errorf("lag_unsettled differs from the subquery count in %d cases", bad)
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

	// Only failures (action 1) on skip-policy queues take a lock: the
	// partition's for one without a wait (route 1), the queue's KEY SHARE
	// for one with a wait, asked (p_retry_ms) or the queue's backoff
	// (route 2). Waiting takes a busy row once it is free; not waiting
	// skips it (route 0: redelivered in place).
	t.Run("lock_skip_failures", func(t *testing.T) {
		var skipP, busyP, pauseP, backP int64
		// Queue "skip" with partitions a and b, queue "pause" with a,
		// queue "back" (skip, a 300 ms backoff) with a.
		if _, err := pool.Exec(ctx, `WITH q AS (
    INSERT INTO `+s+`.queues (tenant, name, failure_policy, retry_backoff_min_ms, retry_backoff_max_ms)
    VALUES (gen_random_uuid(), 'skip', 'skip', 0, 0), (gen_random_uuid(), 'pause', 'pause', 0, 0),
           (gen_random_uuid(), 'back', 'skip', 300, 300) RETURNING id, name)
INSERT INTO `+s+`.partitions (id, queue_id, name)
SELECT `+s+`.partition_key(id, p, 0), id, p FROM q, (VALUES ('a'), ('b')) v(p) WHERE q.name = 'skip' OR v.p = 'a'`); err != nil {
			t.Fatal(err)
		}
		part := func(q, p string) int64 {
			t.Helper()
			var id int64
			if err := pool.QueryRow(ctx, `SELECT p.id FROM `+s+`.partitions p JOIN `+s+`.queues q ON q.id = p.queue_id
WHERE q.name = $1 AND p.name = $2`, q, p).Scan(&id); err != nil {
				t.Fatal(err)
			}
			return id
		}
		skipP, busyP, pauseP, backP = part("skip", "a"), part("skip", "b"), part("pause", "a"), part("back", "a")
		holder, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx)
		if _, err := holder.Exec(ctx, "SELECT 1 FROM "+s+".partitions WHERE id = $1 FOR NO KEY UPDATE", busyP); err != nil {
			t.Fatal(err)
		}
		call := func(wait bool, pids []int64, acts []int16, retry []int64) []int16 {
			t.Helper()
			var got []int16
			if err := pool.QueryRow(ctx, "SELECT "+s+".lock_skip_failures($1, $2, $3, $4)",
				pids, acts, wait, retry).Scan(&got); err != nil {
				t.Fatal(err)
			}
			return got
		}
		got := call(false, []int64{skipP, busyP, pauseP, skipP, backP, busyP},
			[]int16{1, 1, 1, 0, 1, 1}, []int64{0, 0, 0, 0, 0, 500})
		if want := []int16{1, 0, 0, 0, 2, 2}; !slices.Equal(got, want) {
			t.Errorf("without waiting: routes %v, want %v (the busy partition skipped unless its failure waits)", got, want)
		}
		if got := call(false, []int64{skipP}, []int16{1}, nil); !slices.Equal(got, []int16{1}) {
			t.Errorf("no waits given: routes %v, want [1]", got)
		}
		done := make(chan []int16, 1)
		go func() {
			var got []int16
			_ = pool.QueryRow(ctx, "SELECT "+s+".lock_skip_failures($1, $2, true, NULL)",
				[]int64{busyP, skipP}, []int16{1, 1}).Scan(&got)
			done <- got
		}()
		// The waiting call blocks on the held row until it is released.
		holderPID := holder.Conn().PgConn().PID()
		for blocked := false; !blocked; {
			if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE $1 = ANY (pg_blocking_pids(a.pid)))",
				holderPID).Scan(&blocked); err != nil {
				t.Fatal(err)
			}
			select {
			case got := <-done:
				t.Fatalf("waiting call returned %v while the row was held", got)
			default:
			}
		}
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if got := <-done; !slices.Equal(got, []int16{1, 1}) {
			t.Errorf("waiting: routes %v, want [1 1]", got)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// migrated is a context, the shared pool and a fresh schema with every
// migration and the function layer applied.
func migrated(t testing.TB) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return ctxT(t), pool, schema
}
