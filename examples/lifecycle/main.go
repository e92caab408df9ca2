// Command lifecycle shows ordered per-key consumption: file lifecycle events
// (created, overwritten, deleted) are pushed with the file as the ordering
// key (Item.Key), which routes them to one of the queue's 16 lanes, and
// several workers consume them with per-key parallelism (KeyConcurrency).
// Within a file, events are handled in push order, one at a time; different
// files are handled in parallel, also within one lane. No per-event locks,
// no partition per file: millions of files cost the same 16 lanes.
//
// The queue keeps the default failure policy, FailurePause: an event that
// fails is retried in place and later events of that file wait for it
// (until it succeeds or is dead-lettered after RetryLimit failures), while
// other files of its lane go on. With FailureSkip a failed "created" could
// be overtaken by its "deleted".
//
// With QUEEN_DATABASE_URL set it uses that database; otherwise it starts a
// throwaway PostgreSQL cluster from the locally installed binaries.
//
//	go run ./examples/lifecycle
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

const files = 200

type event struct {
	File    string `json:"file"`
	Kind    string `json:"kind"` // created, overwritten, deleted
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
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: "example_lifecycle"})
	if err != nil {
		return err
	}
	defer client.Close(context.Background())
	q := client.Queue("file-events")
	if err := q.Configure(ctx, queen.QueueOptions{FailurePolicy: queen.FailurePause, RetryLimit: 5, DeadLetter: true, Lanes: 16}); err != nil {
		return err
	}

	// The storage service: each file is created, overwritten a few times
	// and deleted. Events of one file are pushed in order (one producer per
	// file here; in general, whoever owns the file's state).
	var total atomic.Int64
	var prod sync.WaitGroup
	for p := range 4 {
		prod.Go(func() {
			for f := p; f < files; f += 4 {
				name := fmt.Sprintf("bucket/file-%04d", f)
				evs := []event{{name, "created", 1}}
				for v, n := 2, 1+rand.IntN(4); v <= n; v++ {
					evs = append(evs, event{name, "overwritten", v})
				}
				evs = append(evs, event{name, "deleted", len(evs) + 1})
				for _, ev := range evs {
					data, _ := json.Marshal(ev)
					if _, err := q.Push(ctx, []queen.Item{{Key: name, Data: data}}); err != nil {
						log.Print(err)
						return
					}
					total.Add(1)
				}
			}
		})
	}

	// The indexer: applies events to its view. Out-of-order events would
	// be detected as invalid transitions. One in ten first deliveries fails
	// transiently; the pause policy retries it before the file moves on.
	var (
		mu       sync.Mutex
		view     = map[string]int{} // file -> version; absent = not there
		invalid  atomic.Int64
		handled  atomic.Int64
		failures atomic.Int64
		deleted  atomic.Int64
	)
	handler := func(ctx context.Context, m *queen.Message) error {
		if m.Attempt == 1 && rand.IntN(10) == 0 {
			failures.Add(1)
			return errors.New("transient indexer error")
		}
		var ev event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			return err
		}
		if ev.File != m.Key {
			return fmt.Errorf("event of %s delivered under key %q", ev.File, m.Key)
		}
		mu.Lock()
		defer mu.Unlock()
		cur, exists := view[ev.File]
		switch {
		case ev.Kind == "created" && !exists,
			ev.Kind == "overwritten" && exists && ev.Version == cur+1:
			view[ev.File] = ev.Version
		case ev.Kind == "deleted" && exists && ev.Version == cur+1:
			delete(view, ev.File)
			deleted.Add(1)
		default:
			invalid.Add(1)
			fmt.Printf("out of order: %s %s v%d (view: exists=%v v%d)\n", ev.File, ev.Kind, ev.Version, exists, cur)
		}
		handled.Add(1)
		return nil
	}
	wctx, stop := context.WithCancel(ctx)
	var workers sync.WaitGroup
	workers.Go(func() {
		err := q.Consume(wctx, queen.ConsumeOptions{
			PopOptions:     queen.PopOptions{Batch: 100},
			Concurrency:    4,  // four lanes at a time
			KeyConcurrency: 16, // up to 16 files of a lane at a time, one event per file
		}, handler)
		if err != nil {
			log.Print(err)
		}
	})
	prod.Wait()
	start := time.Now()
	for handled.Load() < total.Load() && time.Since(start) < time.Minute {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	workers.Wait()
	fmt.Printf("%d events for %d files: %d applied in order, %d transient failures retried in place, %d files deleted, %d out of order\n",
		total.Load(), files, handled.Load(), failures.Load(), deleted.Load(), invalid.Load())
	if invalid.Load() != 0 || deleted.Load() != files {
		return fmt.Errorf("per-key order violated")
	}
	return nil
}
