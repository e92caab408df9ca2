package history_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// TestHistoryOnCitus runs the checker's CI seeds, faults included, against
// a Citus coordinator with two workers: the deployment supported today,
// queen's tables local to the coordinator (with QUEEN_TEST_CITUS_DISTRIBUTE
// set, the distributed layout). Besides the checker's faults, the nemesis
// stops a worker (immediate) and starts it again, then restarts the
// coordinator (immediate), each at least once a seed. It starts its own
// three nodes (a cluster named by URL could not be restarted), so it runs
// when QUEEN_TEST_CITUS_URL is set, as the other Citus tests do, and the
// local server has Citus installed.
func TestHistoryOnCitus(t *testing.T) {
	if testing.Short() {
		t.Skip("history checker")
	}
	if os.Getenv("QUEEN_TEST_CITUS_URL") == "" {
		t.Skip("QUEEN_TEST_CITUS_URL not set (internal/citus/cluster.sh start DIR prints one)")
	}
	node := func() *pgcluster.Cluster {
		return pgtest.NewCluster(t, pgcluster.Options{Settings: map[string]string{
			"max_connections":           "200",
			"shared_preload_libraries":  "citus",
			"max_prepared_transactions": "100",
			// The server inherits the test's HOME, where libpq's default
			// sslmode would look for client certificates.
			"citus.node_conninfo": "sslmode=disable",
		}})
	}
	coord, w1, w2 := node(), node(), node()
	ctx := t.Context()
	exec := func(url string, qs ...string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		for _, q := range qs {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	for _, c := range []*pgcluster.Cluster{coord, w1, w2} {
		exec(c.URL, "CREATE EXTENSION citus")
	}
	exec(coord.URL, fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", coord.Port),
		fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w1.Port),
		fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w2.Port))
	distributed := os.Getenv("QUEEN_TEST_CITUS_DISTRIBUTE") != ""
	seeds, dur := ciSeeds, defaultDuration
	if *flagSeed != 0 {
		seeds = []uint64{*flagSeed}
	}
	if *flagDuration != 0 {
		dur = *flagDuration
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := &run{t: t, seed: seed, cl: coord, workers: []*pgcluster.Cluster{w1, w2}, citus: distributed,
				dur: dur, children: 1}
			st := r.main()
			if st.faults == 0 {
				t.Errorf("no fault injected")
			}
			if r.workerDown.Load() == 0 {
				t.Errorf("no worker stopped")
			}
			if r.restarts.Load() == 0 {
				t.Errorf("coordinator not restarted")
			}
			t.Logf("workers stopped and restarted: %d; coordinator restarts: %d", r.workerDown.Load(), r.restarts.Load())
		})
	}
}
