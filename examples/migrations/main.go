// Command migrations shows per-key mutual exclusion with idempotent
// producers: many application instances race to enqueue schema migrations
// for their tenants, and several workers in two processes (here: two
// clients) apply them, never two at once for one tenant.
//
// The partition is the lock key (the tenant): queen leases a partition to
// one consumer at a time, so a tenant's migrations never run concurrently,
// while different tenants migrate in parallel. The TransactionID is the
// idempotency key: with a DedupWindow, the second and later instances
// enqueueing the same migration get Duplicate and write nothing.
//
// With QUEEN_DATABASE_URL set it uses that database; otherwise it starts a
// throwaway PostgreSQL cluster from the locally installed binaries.
//
//	go run ./examples/migrations
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

const (
	tenants   = 20
	versions  = 3 // migrations v1..v3 per tenant
	instances = 5 // app instances racing to enqueue the same migrations
)

type migration struct {
	Tenant  string `json:"tenant"`
	Version int    `json:"version"`
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, stop, started, err := pgcluster.URLFromEnv(ctx, "QUEEN_DATABASE_URL", pgcluster.Options{})
	if err != nil {
		return err
	}
	defer stop()
	if started {
		fmt.Println("QUEEN_DATABASE_URL is not set: started a throwaway PostgreSQL cluster")
	}
	// Two clients stand for two worker processes sharing the database.
	var clients []*queen.Client
	for range 2 {
		c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: "example_migrations"})
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		clients = append(clients, c)
	}
	q := clients[0].Queue("migrations")
	if err := q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour, DeadLetter: true}); err != nil {
		return err
	}

	// Producers: every instance enqueues every migration it knows about.
	//
	// THE FOOTGUN: the idempotency key must name the effect, not the
	// entity. Keyed "migrate:<tenant>", v2 pushed within the window of v1
	// would be reported Duplicate and silently never run. Keyed
	// "migrate:<tenant>:<version>", each migration is deduplicated only
	// against itself.
	var queued, dups atomic.Int64
	var wg sync.WaitGroup
	for range instances {
		wg.Go(func() {
			for v := 1; v <= versions; v++ {
				items := make([]queen.Item, 0, tenants)
				for t := range tenants {
					tenant := fmt.Sprintf("tenant-%02d", t)
					data, _ := json.Marshal(migration{tenant, v})
					items = append(items, queen.Item{
						Partition:     tenant,                                   // the lock key
						TransactionID: fmt.Sprintf("migrate:%s:v%d", tenant, v), // the effect
						Data:          data,
					})
				}
				res, err := q.Push(ctx, items)
				if err != nil {
					log.Print(err)
					return
				}
				for _, r := range res {
					switch r.Status {
					case queen.Queued:
						queued.Add(1)
					case queen.Duplicate:
						dups.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("%d instances enqueued %d migrations: %d queued, %d duplicates dropped\n",
		instances, instances*tenants*versions, queued.Load(), dups.Load())

	// The footgun, shown: an entity-scoped key swallows v2.
	wrong := clients[0].Queue("migrations-wrong-key")
	if err := wrong.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		return err
	}
	for v := 1; v <= 2; v++ {
		res, err := wrong.Push(ctx, []queen.Item{{Partition: "tenant-00", TransactionID: "migrate:tenant-00"}})
		if err != nil {
			return err
		}
		fmt.Printf("wrong key \"migrate:tenant-00\", v%d: %s\n", v, res[0].Status)
	}

	// Workers: 4 per process. applied is the "database": the schema
	// version per tenant. Applying is idempotent (a redelivered migration
	// at or below the current version is a no-op), because delivery is
	// at-least-once: a worker that dies after migrating but before acking
	// sees its migration again after the lease expires.
	var (
		mu       sync.Mutex
		applied  = map[string]int{}
		running  = map[string]bool{}
		overlaps atomic.Int64
		done     atomic.Int64
	)
	handler := func(ctx context.Context, m *queen.Message) error {
		var mg migration
		if err := json.Unmarshal(m.Data, &mg); err != nil {
			return err
		}
		mu.Lock()
		if running[mg.Tenant] {
			overlaps.Add(1)
		}
		running[mg.Tenant] = true
		mu.Unlock()

		time.Sleep(2 * time.Millisecond) // the migration itself

		mu.Lock()
		if mg.Version > applied[mg.Tenant] {
			if mg.Version != applied[mg.Tenant]+1 {
				fmt.Printf("%s: v%d applied before v%d\n", mg.Tenant, mg.Version, applied[mg.Tenant]+1)
			}
			applied[mg.Tenant] = mg.Version
		}
		running[mg.Tenant] = false
		mu.Unlock()
		done.Add(1)
		return nil
	}
	wctx, stop := context.WithCancel(ctx)
	var workers sync.WaitGroup
	for _, c := range clients {
		workers.Go(func() {
			err := c.Queue("migrations").Consume(wctx, queen.ConsumeOptions{
				PopOptions:  queen.PopOptions{Batch: versions, Wait: 200 * time.Millisecond},
				Concurrency: 4,
			}, handler)
			if err != nil {
				log.Print(err)
			}
		})
	}
	start := time.Now()
	for done.Load() < tenants*versions && time.Since(start) < time.Minute {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	workers.Wait()

	atV := 0
	for _, v := range applied {
		if v == versions {
			atV++
		}
	}
	fmt.Printf("applied %d migrations in %s: %d of %d tenants at v%d; overlapping runs for one tenant: %d\n",
		done.Load(), time.Since(start).Round(time.Millisecond), atV, tenants, versions, overlaps.Load())
	if overlaps.Load() != 0 || atV != tenants {
		return fmt.Errorf("per-key mutual exclusion violated")
	}
	return nil
}
