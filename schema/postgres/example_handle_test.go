package postgres_test

import (
	"context"
	"database/sql"
	"log"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver, for ExampleFromDB

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema/postgres"
)

// The layer on the program's own pool: the pool's settings (TLS,
// credentials, sizes, tracer) are the layer's too. The network bounds that
// schema.Open adds are the pool's to set; here a connect timeout and TCP
// keepalive.
func ExampleFromPool() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 16 // the calls served at once, plus one; at least 2
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}
	cfg.ConnConfig.DialFunc = d.DialContext
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // the program's: after the layer's DB

	db, err := postgres.FromPool(ctx, pool) // checks the pool, applies the outbox migrations
	if err != nil {
		log.Fatal(err) // for example ErrPooledSessions behind PgBouncer in transaction mode
	}
	defer db.Close() // closes what the layer opened on the pool, not the pool
	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = layer // layer.NewServer, outbox.AddTool, layer.Start: see package outbox
}

// The layer on the program's own *sql.DB of pgx's driver.
func ExampleFromDB() {
	ctx := context.Background()
	sqlDB, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()       // the program's: after the layer's DB
	sqlDB.SetMaxOpenConns(17) // the calls served at once, plus one, plus the listener's

	db, err := postgres.FromDB(ctx, sqlDB)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // leaves sqlDB open
	if _, err := outbox.New(db, nil); err != nil {
		log.Fatal(err)
	}
}
