package queen_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/stmt"
)

// The operator and status calls' forms for the Citus layout run on
// PostgreSQL too: with settings.routed set, reset_group, delete_group,
// delete_queue and take_samples take their routed branches, and the
// routed Status, Queues and lag statements read the same state. Each
// agrees with the set-based form: the same moves, rows and samples, and a
// deleted queue leaves nothing.
func TestOpsRoutedMatchSetBased(t *testing.T) {
	skipOnLayout(t, "it compares both forms on PostgreSQL; the set-based ones do not run on the layout")
	type result struct {
		Moves    []string
		Status   []string
		Samples  []queen.GroupSample
		Pushed   int64
		Deleted  queen.GroupDeleted
		Requeued int
	}
	run := func(routed bool) result {
		var r result
		var err error
		var set []stmt.StatusRow
		c := open(t, manual)
		ctx, pool, schema := ctxT(t), c.Pool(), c.Schema()
		tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
		if routed {
			if _, err := pool.Exec(ctx, "UPDATE "+tbl("settings")+" SET routed = true"); err != nil {
				t.Fatal(err)
			}
		}
		q := c.Queue("q")
		for i := range 3 {
			for _, p := range []string{"a", "b", "c", "d"} {
				push(t, q, queen.Item{Partition: p, Data: []byte(fmt.Sprint(p, i))})
			}
		}
		var mid time.Time
		if err := pool.QueryRow(ctx, "SELECT max(created_at) FROM "+tbl("segments")+" WHERE base_offset = 0").Scan(&mid); err != nil {
			t.Fatal(err)
		}
		move := func(group string, to queen.ResetTo, o queen.ResetOptions) {
			t.Helper()
			moves, err := q.ResetGroup(ctx, group, to, o)
			if err != nil {
				t.Fatalf("ResetGroup(%s): %v", group, err)
			}
			for _, m := range moves {
				r.Moves = append(r.Moves, fmt.Sprintf("%s %+v", group, m))
			}
		}
		move("all", queen.ResetEarliest(), queen.ResetOptions{})
		move("all", queen.ResetToOffsets(map[string]int64{"a": 2, "c": 9}), queen.ResetOptions{})
		// Subscribed "new" with a cursor on a only: on b, c and d it
		// starts where seed_offset says (the segment probe).
		move("new", queen.ResetLatest(), queen.ResetOptions{Partitions: []string{"a"}})
		move("time", queen.ResetToTime(mid.Add(time.Microsecond)), queen.ResetOptions{Partitions: []string{"b", "d"}})
		if _, err := q.ResetGroup(ctx, "x", queen.ResetLatest(), queen.ResetOptions{Partitions: []string{"a", "nope"}}); !errors.Is(err, queen.ErrNotFound) {
			t.Errorf("ResetGroup on a missing partition: %v, want ErrNotFound", err)
		}
		push(t, q, queen.Item{Partition: "b", Data: []byte("b3")}, queen.Item{Partition: "e", Data: []byte("e0")})
		if _, err := pool.Exec(ctx, "UPDATE "+tbl("consumers")+` SET batch_end = committed + 1, lease_id = gen_random_uuid(),
			lease_owner = 'holder', lease_expires_at = now() + interval '1 minute', settled = '{2}'
			WHERE group_name = 'all' AND partition_id = (SELECT id FROM `+tbl("partitions")+` WHERE name = 'b')`); err != nil {
			t.Fatal(err)
		}
		if _, err := q.ResetGroup(ctx, "all", queen.ResetEarliest(), queen.ResetOptions{}); !errors.Is(err, queen.ErrGroupActive) {
			t.Errorf("ResetGroup with a live lease: %v, want ErrGroupActive", err)
		}

		// Dead letters of a and b, one message of b dead-lettered by two
		// groups (requeued once), then requeued to their partitions.
		for _, dl := range []struct{ part, group, id string }{
			{"a", "all", "0c7f1e7a-0000-4000-8000-00000000000a"}, {"b", "all", "0c7f1e7a-0000-4000-8000-00000000000b"},
			{"b", "time", "0c7f1e7a-0000-4000-8000-00000000000b"}} {
			if _, err := pool.Exec(ctx, `SELECT `+tbl("insert_dead_letters")+`(q.id, p.id, p.name, $2, '{1}', '{1}',
					`+tbl("dead_letter_snapshots")+`('test', 1, NULL, ARRAY[$3::uuid], '{t}', '{0}', ARRAY['\x01'::bytea],
						ARRAY[now()], NULL, NULL, '{r}'))
				FROM `+tbl("queues")+` q JOIN `+tbl("partitions")+` p ON p.queue_id = q.id AND p.name = $1`, dl.part, dl.group, dl.id); err != nil {
				t.Fatal(err)
			}
		}
		if r.Requeued, err = q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{}); err != nil || r.Requeued != 2 {
			t.Fatalf("RequeueDeadLetters = %d, %v; want 2", r.Requeued, err)
		}

		// The routed statements read what the set-based ones read.
		cs := stmt.NewConsume(schema)
		ref := stmt.QueueRef{Tenant: queen.DefaultTenant, Name: "q"}
		set, err = stmt.Status(ctx, cs, pool, ref, false)
		if err != nil {
			t.Fatal(err)
		}
		rt, err := stmt.Status(ctx, cs, pool, ref, true)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rt {
			rt[i].Now = set[min(i, len(set)-1)].Now
		}
		if !reflect.DeepEqual(set, rt) {
			t.Errorf("Status rows:\n set-based %+v\n routed    %+v", set, rt)
		}
		for _, x := range set {
			r.Status = append(r.Status, fmt.Sprintf("%s %v %v %v %v %v", x.Partition, deref(x.Group), deref(x.Committed), deref(x.Lag),
				x.Settled != nil, x.BatchEnd != nil))
		}
		qs, err := stmt.Queues(ctx, cs, pool, queen.DefaultTenant, false)
		if err != nil {
			t.Fatal(err)
		}
		qr, err := stmt.Queues(ctx, cs, pool, queen.DefaultTenant, true)
		if err != nil {
			t.Fatal(err)
		}
		for i := range qr {
			qr[i].Now = qs[min(i, len(qs)-1)].Now
		}
		if !reflect.DeepEqual(qs, qr) {
			t.Errorf("Queues rows:\n set-based %+v\n routed    %+v", qs, qr)
		}
		ls, err := stmt.LagByGroup(ctx, stmt.New(schema), pool, false)
		if err != nil {
			t.Fatal(err)
		}
		lr, err := stmt.LagByGroup(ctx, stmt.New(schema), pool, true)
		if err != nil {
			t.Fatal(err)
		}
		// Neither statement orders its groups.
		for _, rows := range [][]stmt.LagRow{ls, lr} {
			slices.SortFunc(rows, func(a, b stmt.LagRow) int {
				return strings.Compare(fmt.Sprint(a.Tenant, "/", a.Queue, "/", a.Group), fmt.Sprint(b.Tenant, "/", b.Queue, "/", b.Group))
			})
		}
		if len(ls) != len(lr) {
			t.Errorf("lag rows: %+v, routed %+v", ls, lr)
		}
		for i := range min(len(ls), len(lr)) {
			a, b := ls[i], lr[i]
			if a.Tenant != b.Tenant || a.Queue != b.Queue || a.Group != b.Group || a.Messages != b.Messages ||
				(a.Seconds == 0) != (b.Seconds == 0) || a.Seconds-b.Seconds > 1 || b.Seconds-a.Seconds > 1 {
				t.Errorf("lag row %d: %+v, routed %+v", i, a, b)
			}
		}

		if ok, err := q.ReleaseLease(ctx, "all", "b"); err != nil || !ok {
			t.Fatalf("ReleaseLease = %v, %v", ok, err)
		}
		if rep := maintain(t, c); rep.Samples != 1 {
			t.Fatalf("samples taken: %d, want 1", rep.Samples)
		}
		smp, err := q.Samples(ctx)
		if err != nil || len(smp.Samples) != 1 {
			t.Fatalf("Samples = %+v, %v", smp, err)
		}
		r.Samples, r.Pushed = smp.Samples[0].Groups, smp.Samples[0].Pushed
		if r.Deleted, err = q.DeleteGroup(ctx, "time", queen.DeleteGroupOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := q.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		for _, tb := range []string{"partitions", "segments", "txns", "consumers", "backlog", "subscriptions"} {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl(tb)).Scan(&n); err != nil || n != 0 {
				t.Errorf("%s after Delete: %d rows, %v", tb, n, err)
			}
		}
		return r
	}
	set, routed := run(false), run(true)
	if !reflect.DeepEqual(set, routed) {
		t.Errorf("set-based:\n%+v\nrouted:\n%+v", set, routed)
	}
	t.Logf("%+v", routed)
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
