package queen_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// testDistributedConsumerLag: the consumer_lag view on the distributed
// layout has a row per (partition, group) cursor with Queue.Status's
// committed offset and lag, and seconds behind exactly when it lags; a
// group that never contacted a partition has no row for it in the view. A schema
// distributed by a release whose view called lag_head gets the view that
// runs when a client of this one opens it (the function layer, re-applied).
func testDistributedConsumerLag(t *testing.T, url string) {
	_, pool, schema := openCitus(t, url, true)
	ctx := ctxT(t)
	// The earlier release's view and function layer revision.
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE VIEW `+tbl("consumer_lag")+` AS
		SELECT q.tenant, q.name AS queue, p.name AS partition, c.group_name, p.last_offset, c.committed,
		    `+tbl("lag_messages")+`(p.last_offset, c.committed, p.log_start) AS lag_messages,
		    CASE WHEN `+tbl("lag_messages")+`(p.last_offset, c.committed, p.log_start) > 0 THEN
		        extract(epoch FROM clock_timestamp() - `+tbl("lag_head")+`(p.id, c.committed, p.log_start))
		    ELSE 0 END AS lag_seconds,
		    c.lease_owner, c.lease_expires_at
		FROM `+tbl("consumers")+` c JOIN `+tbl("partitions")+` p ON p.id = c.partition_id
		JOIN `+tbl("queues")+` q ON q.id = p.queue_id`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+tbl("schema_functions")+" SET revision = 1, hash = 'earlier'"); err != nil {
		t.Fatal(err)
	}
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Citus: true,
		Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	q := c.Queue("lag")
	for i := range 4 {
		pushN(t, q, fmt.Sprint("p", i), "m", 3)
	}
	// "lagging" reads and acks one partition's first message; "caught"
	// reads everything.
	msgs := pop(t, q, queen.PopOptions{Group: "lagging", Partition: "p0", Batch: 1})
	wantData(t, msgs, "m0")
	ack(t, msgs[0])
	for {
		msgs := pop(t, q, queen.PopOptions{Group: "caught", Batch: 100, Partitions: 4})
		if len(msgs) == 0 {
			break
		}
		ackAll(t, msgs)
	}
	time.Sleep(10 * time.Millisecond) // lag_seconds > 0 for the lagging rows

	type row struct {
		committed, lag int64
		behind         bool
	}
	rows, err := pool.Query(ctx, `SELECT queue, partition, group_name, committed, lag_messages, lag_seconds
		FROM `+tbl("consumer_lag"))
	if err != nil {
		t.Fatalf("consumer_lag: %v", err)
	}
	view := map[string]row{}
	for rows.Next() {
		var qn, p, g string
		var r row
		var secs float64
		if err := rows.Scan(&qn, &p, &g, &r.committed, &r.lag, &secs); err != nil {
			t.Fatal(err)
		}
		if secs < 0 || (secs > 0) != (r.lag > 0) {
			t.Errorf("consumer_lag %s/%s/%s: lag %d, %v seconds", qn, p, g, r.lag, secs)
		}
		r.behind = secs > 0
		view[qn+"/"+p+"/"+g] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("consumer_lag: %v", err)
	}
	st, err := q.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]row{}
	for _, p := range st.Partitions {
		for _, g := range p.Groups {
			status["lag/"+p.Name+"/"+g.Group] = row{g.Committed, g.Lag, g.LagAge > 0}
		}
	}
	// Status also reports the partitions a subscribed group has no cursor
	// on yet (lagging's p1-p3) as unread; the view, as on PostgreSQL, has
	// rows for cursors only.
	for k, r := range status {
		if _, ok := view[k]; !ok && r.committed == -1 && r.lag == 3 && strings.HasSuffix(k, "/lagging") {
			delete(status, k)
		}
	}
	if len(view) != 5 || fmt.Sprint(view) != fmt.Sprint(status) {
		t.Fatalf("consumer_lag rows:\n%v\nQueue.Status:\n%v", view, status)
	}
	if r := view["lag/p0/lagging"]; r.committed != 0 || r.lag != 2 || !r.behind {
		t.Errorf("lagging on p0: %+v, want committed 0, lag 2", r)
	}
	for i := range 4 {
		if r := view[fmt.Sprint("lag/p", i, "/caught")]; r.committed != 2 || r.lag != 0 {
			t.Errorf("caught on p%d: %+v, want committed 2, lag 0", i, r)
		}
	}
}

// testDistributedSchedule: pushes with Item.DeliverAt on the distributed
// layout, one due soon (a generation row) and one past the hour (a row of
// scheduled) in one call: both scheduled, repeats duplicates of them, the
// far one cancelled, the near one delivered once when due.
func testDistributedSchedule(t *testing.T, url string) {
	c, _, _ := openCitus(t, url, true)
	ctx := ctxT(t)
	q := c.Queue("sched")
	items := func() []queen.Item {
		return []queen.Item{
			{Partition: "p", TransactionID: "near", Data: []byte("near"), DeliverAt: time.Now().Add(3 * time.Second)},
			{Partition: "p", TransactionID: "far", Data: []byte("far"), DeliverAt: time.Now().Add(2 * time.Hour)},
		}
	}
	first := push(t, q, items()...)
	for _, r := range first {
		if r.Status != queen.Scheduled {
			t.Fatalf("scheduled push: %+v", r)
		}
	}
	for i, r := range push(t, q, items()...) {
		if r.Status != queen.Duplicate || r.MessageID != first[i].MessageID {
			t.Errorf("repeat of %s: %+v, want a duplicate of %s", first[i].TransactionID, r, first[i].MessageID)
		}
	}
	if n, err := q.CancelScheduled(ctx, []string{"far"}); err != nil || n != 1 {
		t.Fatalf("CancelScheduled = %d, %v; want 1", n, err)
	}
	var got []string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && len(got) == 0; {
		msgs := pop(t, q, queen.PopOptions{Batch: 10, Wait: time.Second})
		got = append(got, datas(msgs)...)
		ackAll(t, msgs)
	}
	got = append(got, datas(pop(t, q, queen.PopOptions{Batch: 10, Wait: 2 * time.Second}))...)
	if fmt.Sprint(got) != "[near]" {
		t.Fatalf("delivered %q, want the near item once", got)
	}
}
