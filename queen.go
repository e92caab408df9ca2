package queen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/e03140bc/queen/internal/citus"
	"github.com/e03140bc/queen/internal/claimfuse"
	"github.com/e03140bc/queen/internal/connstr"
	"github.com/e03140bc/queen/internal/maintain"
	"github.com/e03140bc/queen/internal/seal"
	"github.com/e03140bc/queen/internal/settings"
	"github.com/e03140bc/queen/internal/settle"
	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/internal/wake"
	"github.com/e03140bc/queen/spool"
	"github.com/e03140bc/queen/sqlschema"
)

// DefaultTenant is the tenant of a client whose Config.Tenant is the zero
// UUID: the nil UUID itself, so single-tenant deployments never think about it.
var DefaultTenant = uuid.Nil

// Config configures a Client. The zero value of every field means its
// documented default.
type Config struct {
	// DatabaseURL is a libpq URL or key=value DSN, used when Pool is nil.
	// Defaults to $QUEEN_DATABASE_URL. Open's errors name what is wrong
	// with it without quoting it, as it may hold a password.
	DatabaseURL string
	// Pool is a pool the caller owns. Close never closes it. When nil, Open
	// creates a pool from DatabaseURL and Close closes it. Either way its
	// connections must describe statements (pgx's default_query_exec_mode
	// cache_statement, the default, cache_describe or describe_exec): Open
	// refuses exec and simple_protocol.
	Pool *pgxpool.Pool
	// Schema holds every table and function. Defaults to "queen". Two clients
	// with different schemas in one database are fully independent.
	Schema string
	// Citus makes Open convert Schema to the Citus layout after migrating
	// it (sqlschema.Distribute: per-partition tables distributed by
	// partition id, per-queue tables reference tables); DatabaseURL or Pool
	// must reach a Citus coordinator. What the layout does not give: README,
	// "On Citus". Defaults to false: the tables stay local, as on
	// PostgreSQL; a schema already distributed is run as on the layout all
	// the same.
	Citus bool
	// SpoolDir is the disk spool for pushes PostgreSQL could not take. Each
	// process needs its own: when it is taken, Open uses SpoolDir.1, .2, ...
	// Defaults to a directory under os.TempDir() named after the user, the
	// schema and the database, so a restarted process drains what its last
	// run left. It is created 0700; Open fails (spool.ErrUnsafeDir) if it,
	// a symlink to it or a spool file in it belongs to another user, or if
	// group or others can write to it.
	SpoolDir string
	// EncryptionKey is the 32-byte AES-256-GCM key for queues with Encryption
	// on: it encrypts every new payload and decrypts those it encrypted.
	// Defaults to none: pushes to an encrypted queue then fail.
	EncryptionKey []byte
	// DecryptionKeys are further 32-byte keys used only to decrypt (each
	// stored payload names its key by an id derived from it). To rotate
	// with no process ever unable to read: add the new key here in every
	// process; then make it EncryptionKey and list the old one here; drop
	// the old one once no retained message or dead letter was encrypted
	// with it. Defaults to none.
	DecryptionKeys [][]byte
	// StatementTimeout bounds each database statement the engine runs, and
	// connecting, for the pool Open creates from DatabaseURL unless it sets
	// connect_timeout (or PGCONNECT_TIMEOUT does). Defaults to
	// DefaultStatementTimeout (30s).
	StatementTimeout time.Duration
	// Fusion tunes the push engine. The zero value means the defaults.
	Fusion FusionConfig
	// Logger receives the engine's logs, each with a "schema" attribute.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider traces pushes and Consume: a producer span "send
	// <queue>" per Push, PushTx and Tx.Push call, whose context is put into
	// each item's headers by Propagator, and a consumer span "process
	// <queue>" per message Consume hands to its handler, a child of the
	// context the message was pushed under (see ContextFrom). A no-op
	// provider (go.opentelemetry.io/otel/trace/noop) turns this off: no
	// span, no header. Defaults to the OpenTelemetry global: while no SDK
	// is installed there (otel.SetTracerProvider), no span is started, and
	// one installed after Open is used from then on.
	TracerProvider trace.TracerProvider
	// Propagator writes the trace context into pushed messages' headers and
	// reads it back. Defaults to the OpenTelemetry global
	// (otel.GetTextMapPropagator(), which propagates nothing until one is
	// set). Read when Open runs: set the global one before.
	Propagator propagation.TextMapPropagator
	// MeterProvider defaults to the OpenTelemetry global.
	MeterProvider metric.MeterProvider
	// Tenant is the default tenant of this client's queues. Defaults to
	// DefaultTenant (the nil UUID).
	Tenant uuid.UUID
	// Maintenance tunes retention and purging. The zero value means the
	// defaults.
	Maintenance MaintenanceConfig

	test *testConfig // knobs only tests set; nil for none
}

// testConfig holds a client's knobs that only tests set (through the
// package's export_test helpers, as options to Open). Open fills in the
// defaults of those left zero.
type testConfig struct {
	metaCacheMax int // bound on cached queue settings; 0: settings.DefaultMax
	// popRescan is how often a waiting Pop or Consume looks again without
	// a wake. Defaults to defaultPopRescan.
	popRescan time.Duration
	// maxBundleBytes bounds the frame bytes of one push_bundle call.
	// Defaults to defaultMaxBundleBytes.
	maxBundleBytes int
	// spoolAppend writes records to the spool; tests slow it down like a
	// busy disk. Defaults to spool.Spool.Append.
	spoolAppend func(s *spool.Spool, ctx context.Context, recs []spool.Record) error
	// schedulePoll is the scheduled mover's backstop poll. Defaults to
	// defaultSchedulePoll.
	schedulePoll time.Duration
	// memberHeartbeat and memberTTL are DefaultMemberHeartbeat and
	// MemberTTL for this client (its Consume calls' heartbeats, what its
	// Status and Queues count as live, what its maintenance expires).
	memberHeartbeat time.Duration
	memberTTL       time.Duration
	// sampleInterval is SampleInterval for this client (what its
	// maintenance takes and its Queue.Samples reads).
	sampleInterval time.Duration
	// noLinger keeps Consume from keeping drained leases (linger): for
	// tests of the claim and settle paths that the linger bypasses.
	noLinger bool
	// noHandOff keeps pushes from taking for a lingering worker
	// (push_take): it takes by pop_linger, as before the hand-off.
	noHandOff bool
	// takeHook, if set, runs in a push that reserved a lingering worker,
	// before its statement: tests race the worker's way out against it.
	takeHook func()
}

// schedulePollOr is t's schedulePoll, or d when unset.
func (t *testConfig) schedulePollOr(d time.Duration) time.Duration {
	if t.schedulePoll > 0 {
		return t.schedulePoll
	}
	return d
}

// testKnobs is c's test config, never nil.
func (c *Config) testKnobs() *testConfig {
	if c.test == nil {
		c.test = new(testConfig)
	}
	return c.test
}

// withDefaults is a copy of t with every zero knob at its default.
func (t testConfig) withDefaults() *testConfig {
	if t.popRescan <= 0 {
		t.popRescan = defaultPopRescan
	}
	if t.maxBundleBytes <= 0 {
		t.maxBundleBytes = defaultMaxBundleBytes
	}
	if t.memberHeartbeat <= 0 {
		t.memberHeartbeat = DefaultMemberHeartbeat
	}
	if t.memberTTL <= 0 {
		t.memberTTL = MemberTTL
	}
	if t.sampleInterval <= 0 {
		t.sampleInterval = SampleInterval
	}
	if t.spoolAppend == nil {
		t.spoolAppend = (*spool.Spool).Append
	}
	return &t
}

// FusionConfig tunes the fusion engine. Each zero field takes the value of
// the matching QUEEN_FUSION_* environment variable if set, else its default.
type FusionConfig struct {
	// Shards is the number of fusion shards; a partition always maps to the
	// same one. Defaults to DefaultFusionShards (QUEEN_FUSION_SHARDS).
	Shards int
	// BundleMax caps the partitions committed in one transaction. Defaults to
	// DefaultBundleMax (QUEEN_FUSION_BUNDLE_MAX).
	BundleMax int
	// BundleBase is the bundle size that grows with the backlog: a bundle
	// takes every ready partition up to BundleBase; with more waiting it
	// takes half of them, at least BundleBase, at most BundleMax, so a deep
	// backlog (a 1000-item push over 1000 partitions) goes in a few large
	// commits and a light load in small, quick ones. Defaults to
	// DefaultBundleBase (QUEEN_FUSION_BUNDLE_BASE).
	BundleBase int
	// Hold is the liveness backstop tick, not a batching window. Defaults to
	// DefaultFusionHold (QUEEN_FUSION_HOLD_MS, in milliseconds).
	Hold time.Duration
	// MaxBufferedBytes bounds the payload bytes the engine holds for pushes
	// not yet committed (or spooled). A Push blocks while it is full, until
	// its context ends (it then returns ctx.Err()) or a flush frees room; a
	// push larger than the bound goes through alone. Defaults to
	// DefaultMaxBufferedBytes.
	MaxBufferedBytes int64
}

// withDefaults works on a copy and validates, naming the bad field.
func (c Config) withDefaults() (Config, error) {
	if c.DatabaseURL == "" && c.Pool == nil {
		c.DatabaseURL = os.Getenv("QUEEN_DATABASE_URL")
	}
	if c.DatabaseURL == "" && c.Pool == nil {
		return c, errors.New("queen: Config.DatabaseURL (or $QUEEN_DATABASE_URL) or Config.Pool is required")
	}
	if c.Schema == "" {
		c.Schema = "queen"
	}
	if err := sqlschema.ValidSchema(c.Schema); err != nil {
		return c, fmt.Errorf("%w: Config.Schema: %w", ErrInvalidName, err)
	}
	if c.EncryptionKey != nil && len(c.EncryptionKey) != 32 {
		return c, fmt.Errorf("%w: Config.EncryptionKey must be 32 bytes, have %d", ErrEncryption, len(c.EncryptionKey))
	}
	for i, k := range c.DecryptionKeys {
		if len(k) != 32 {
			return c, fmt.Errorf("%w: Config.DecryptionKeys[%d] must be 32 bytes, have %d", ErrEncryption, i, len(k))
		}
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.StatementTimeout < 0 {
		return c, errors.New("queen: Config.StatementTimeout must not be negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Tenant == uuid.Nil {
		c.Tenant = DefaultTenant
	}
	c.Maintenance = c.Maintenance.withDefaults()
	f := &c.Fusion
	f.Shards = envDefault(f.Shards, "QUEEN_FUSION_SHARDS", DefaultFusionShards)
	f.BundleMax = envDefault(f.BundleMax, "QUEEN_FUSION_BUNDLE_MAX", DefaultBundleMax)
	f.BundleBase = envDefault(f.BundleBase, "QUEEN_FUSION_BUNDLE_BASE", DefaultBundleBase)
	if f.Hold == 0 {
		f.Hold = time.Duration(envDefault(0, "QUEEN_FUSION_HOLD_MS", int(DefaultFusionHold/time.Millisecond))) * time.Millisecond
	}
	if f.MaxBufferedBytes < 0 {
		return c, errors.New("queen: Config.Fusion.MaxBufferedBytes must not be negative")
	}
	if f.MaxBufferedBytes == 0 {
		f.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if f.Shards < 1 || f.BundleMax < 1 || f.BundleBase < 1 || f.Hold < 0 {
		return c, fmt.Errorf("queen: Config.Fusion: Shards, BundleMax and BundleBase must be >= 1, Hold >= 0 (have %d, %d, %d, %s)",
			f.Shards, f.BundleMax, f.BundleBase, f.Hold)
	}
	return c, nil
}

func envDefault(v int, env string, def int) int {
	if v != 0 {
		return v
	}
	if s := os.Getenv(env); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return def
}

// Client is a connection to one queen schema. It is safe for concurrent use.
// Handles from WithTenant share its engine.
type Client struct {
	e      *engine
	tenant uuid.UUID
}

// engine is what every tenant handle shares: the pool, the goroutines and
// their state.
type engine struct {
	cfg     Config
	pool    *pgxpool.Pool
	ownPool bool
	sql     *stmt.Set
	log     *slog.Logger
	keys    seal.Keyring    // Config.EncryptionKey and DecryptionKeys
	meta    *settings.Cache // the queue settings a push needs; made with the engine context
	// placement is where the partitions table's shards live on the Citus
	// layout (Config.Citus), nil elsewhere: bundles split by worker.
	placement citus.Shards
	tracer    trace.Tracer // nil when Config.TracerProvider is a no-op
	prop      propagation.TextMapPropagator
	injects   bool // prop writes some field
	// viaGlobal: the provider is OpenTelemetry's global one as it was
	// before any SDK was installed; spans start once one is.
	viaGlobal bool

	// ctx is the engine's own context: background work and shared flushes run
	// on it, never on a caller's context.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// closed is set once, under mu, when Close begins; isClosed reads it
	// without the lock (every push asks).
	closed    atomic.Bool
	closeDone chan struct{}
	closeErr  error

	push  *pusher
	wake  *wake.Hub
	meter *meters
	maint *maintain.Maintainer
	acks  *settle.Fusion

	// The disk spool, its drain, and the schema-wide maintenance flag.
	spool   *spool.Spool
	drain   *drainer
	maintOn atomic.Bool
	// maintGen counts this client's SetMaintenance calls, under maintMu
	// with the store of maintOn they make; maintRead serializes re-reads.
	maintMu   sync.Mutex
	maintGen  uint64
	maintRead sync.Mutex
	mover     *mover
	encSet    atomic.Pointer[encQueueSet] // without a key: the encrypted queues at the last contact
	spoolReg  metric.Registration
	keyReg    metric.Registration // the per-key Consume gauges

	// The consumption side: its statements, the lease owner this client
	// writes, and the LISTEN loop that wakes parked pops for other
	// processes' pushes.
	csql     *stmt.Consume
	owner    string
	listen   *wake.Listener
	claims   claimfuse.Fusion[*Message]
	segs     segCache
	consumes consumeSet // running Consume calls, stopped first by Close
	// lingers is the workers lingering idle on a partition, to which a
	// push of this client hands what it takes (see handOff).
	lingers  lingerSlots
	keyStats keyStats // running per-key batches (KeyConcurrency > 1)
	// keyed holds the metaKeys of queues seen keyed (markKeyed).
	keyed sync.Map

	svcs []service // what Open started, in start order
}

// Open connects, applies the embedded migrations and starts the engine.
func Open(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.test = cfg.testKnobs().withDefaults() // a copy: the caller's Config is not touched
	// Several clients may share a process (and a logger): every line says
	// which schema it is about.
	e := &engine{cfg: cfg, log: cfg.Logger.With("schema", cfg.Schema), pool: cfg.Pool, closeDone: make(chan struct{})}
	e.tracer, e.prop = tracerOf(cfg.TracerProvider), cfg.Propagator
	e.viaGlobal = idleGlobal != nil && cfg.TracerProvider == idleGlobal
	// Read once: a propagator that writes no fields (the global default)
	// costs a push nothing.
	e.injects = len(cfg.Propagator.Fields()) > 0
	if e.pool == nil {
		// Its errors quote no part of the URL, which may hold a password.
		pcfg, err := connstr.ParseConfig(cfg.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("queen: parse DatabaseURL: %w", err)
		}
		if pcfg.MaxConns < 16 {
			// Fusion keeps several bundles in flight and pops run beside them.
			pcfg.MaxConns = 16
		}
		if pcfg.ConnConfig.ConnectTimeout == 0 {
			// No connect_timeout in the URL: pgxpool would wait 2 minutes
			// for a host that does not answer, longer than a call may take.
			pcfg.ConnConfig.ConnectTimeout = cfg.StatementTimeout
		}
		e.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, fmt.Errorf("queen: create pool: %w", err)
		}
		e.ownPool = true
	}
	fail := func(err error) (*Client, error) {
		if e.ownPool {
			e.pool.Close()
		}
		return nil, err
	}
	switch m := e.pool.Config().ConnConfig.DefaultQueryExecMode; m {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		// The statements bind arrays whose types pgx learns from the
		// statement's description: without one a push cannot be sent at
		// all, and would be spooled for a replay that fails alike.
		return fail(fmt.Errorf("queen: default_query_exec_mode %v is not supported: queen's statements need the server's "+
			"description of their parameters (use cache_statement, the default, cache_describe or describe_exec)", m))
	}
	if err := e.pool.Ping(ctx); err != nil {
		return fail(fmt.Errorf("queen: ping: %w", err))
	}
	if _, err := sqlschema.Migrate(ctx, e.pool, cfg.Schema); err != nil {
		return fail(err)
	}
	if !cfg.Citus {
		// A schema another client distributed is run with the layout's
		// statements whatever this Config says: PostgreSQL's fail there.
		dist, err := sqlschema.Distributed(ctx, e.pool, cfg.Schema)
		if err != nil {
			return fail(err)
		}
		if dist {
			e.log.Info("queen: the schema is distributed on Citus: running it as Config.Citus does")
			e.cfg.Citus = true
		}
	} else if err := sqlschema.Distribute(ctx, e.pool, cfg.Schema); err != nil {
		return fail(err)
	}
	if e.cfg.Citus {
		if err := e.loadPlacement(ctx); err != nil {
			return fail(err)
		}
	}
	e.sql = stmt.New(cfg.Schema)
	e.csql = stmt.NewConsume(cfg.Schema)
	e.owner = newOwner()
	if e.keys, err = seal.Load(cfg.EncryptionKey, cfg.DecryptionKeys); err != nil {
		return fail(err)
	}
	e.meter, err = newMeters(cfg.MeterProvider)
	if err != nil {
		return fail(err)
	}
	e.refreshMaintenance(ctx)
	e.refreshEncrypted(ctx)
	if err := e.startServices(ctx); err != nil {
		return fail(err)
	}
	return &Client{e: e, tenant: cfg.Tenant}, nil
}

// WithTenant returns a handle that reaches only tenant id's queues. It shares
// this client's engine; closing either closes both.
func (c *Client) WithTenant(id uuid.UUID) *Client {
	return &Client{e: c.e, tenant: id}
}

// Tenant is the tenant this handle reaches.
func (c *Client) Tenant() uuid.UUID { return c.tenant }

// Close stops intake, flushes what the engine holds, and stops every
// goroutine the client started. It returns within ctx. If ctx ends first,
// Close returns ctx.Err() and the shutdown goes on in the background: what
// was not flushed is spooled (Buffered) rather than lost, the spool drain
// starts nothing new, and statements already running are let finish
// (within Config.StatementTimeout) so that what they store is confirmed and
// not replayed again; unreplayed records stay in the spool for the next
// Open. Calls after the first wait for the first to finish and return its
// result, so a later Close with a longer context waits for that shutdown.
// It never closes a caller-supplied Pool.
func (c *Client) Close(ctx context.Context) error {
	e := c.e
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		select {
		case <-e.closeDone:
			return e.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.closed.Store(true)
	e.mu.Unlock()

	go e.shutdown(ctx)
	select {
	case <-e.closeDone:
		return e.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown is Close's work; it sets closeErr and closes closeDone.
func (e *engine) shutdown(ctx context.Context) {
	// The services in reverse start order (see services), then the pool.
	err := stopServices(ctx, e.svcs)
	if e.ownPool {
		e.pool.Close()
	}
	e.closeErr = err
	close(e.closeDone)
}

func (e *engine) isClosed() bool { return e.closed.Load() }

// Pool is the pool the client uses (its own or the one in Config).
func (c *Client) Pool() *pgxpool.Pool { return c.e.pool }

// Schema is the PostgreSQL schema the client uses.
func (c *Client) Schema() string { return c.e.cfg.Schema }

// Stats are cumulative counters of the push engine.
type Stats struct {
	Commits  int64 // push bundle transactions
	Segments int64 // segments committed (one per partition per bundle)
	Items    int64 // items flushed

	Pops   int64 // claims asked for by Pop (one per Pop without Wait, one per look with it)
	Claims int64 // claim transactions run for them

	AckCommits int64 // settle transactions run by ack fusion
	Acks       int64 // settlements (Ack, Fail, Retry, DeadLetter) they carried
}

// Stats reports the engine's counters since Open. Segments far above Commits
// is the evidence that fusion coalesces partitions into shared commits; Pops
// above Claims and Acks above AckCommits are the same for the consumption
// side.
func (c *Client) Stats() Stats {
	s := c.e.push.fusion.Stats()
	a := c.e.acks.Stats()
	return Stats{
		Commits: int64(s.Bundles), Segments: int64(s.Segments), Items: int64(s.Items),
		Pops: c.e.claims.Pops.Load(), Claims: c.e.claims.Claims.Load(),
		AckCommits: int64(a.Bundles), Acks: int64(a.Items),
	}
}
