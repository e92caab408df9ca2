package queen_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/e03140bc/queen"
)

// Graceful shutdown: SIGTERM (or Ctrl-C) ends ctx, so Consume stops
// claiming and hands back, uncharged, every message it has not started:
// another process takes them at once. Handlers already running keep an
// uncancelled context for up to SoftStop; what they finish is acked, and an
// error they return after their context was cancelled by the stop counts
// as interrupted, not failed. Keep SoftStop plus the Close timeout inside
// the orchestrator's grace period (30s by default on Kubernetes).
func ExampleQueue_Consume_gracefulShutdown() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	client, err := queen.Open(ctx, queen.Config{DatabaseURL: os.Getenv("QUEEN_DATABASE_URL")})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := client.Close(cctx); err != nil {
			log.Print(err)
		}
	}()

	err = client.Queue("orders").Consume(ctx, queen.ConsumeOptions{
		PopOptions:     queen.PopOptions{Batch: 100},
		Concurrency:    16,
		SoftStop:       20 * time.Second,
		HandlerTimeout: time.Minute,
	}, func(ctx context.Context, m *queen.Message) error {
		return process(ctx, m.Data)
	})
	if err != nil {
		log.Print(err)
	}
}

func process(ctx context.Context, data []byte) error { return ctx.Err() }
