package queenui_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queenui"
)

// Mount the dashboard under /queen/ of a service's admin server, beside
// its own routes. With Actions it can replay dead letters, behind a
// confirmation step and CSRF protection; put it behind your own
// authentication, as any admin page. The example does not run: it would
// serve forever.
func ExampleNew() {
	ctx := context.Background()
	client, err := queen.Open(ctx, queen.Config{DatabaseURL: os.Getenv("QUEEN_DATABASE_URL")})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	mux := http.NewServeMux()
	mux.Handle("/queen/", http.StripPrefix("/queen", queenui.New(client, queenui.Options{Actions: true})))
	log.Fatal(http.ListenAndServe("localhost:8081", mux))
}
