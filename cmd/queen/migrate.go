package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/e03140bc/queen/sqlschema"
)

var cmdMigrateUp = &command{
	name:  "migrate-up",
	short: "apply the migrations the schema lacks",
	long: `Creates the schema if needed and applies every migration it lacks, each in its own
transaction, under an advisory lock (any number of processes may run it at once).
queen.Open does the same; this command is for deployments that migrate before
they roll out. --citus then converts the schema to the Citus layout, as
Config.Citus does (see the README, "On Citus").`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.BoolVar(&o.citus, "citus", false, "then distribute the schema's tables across the Citus workers (idempotent)")
	},
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 0); !ok {
			return code
		}
		p, code := e.pool(2)
		if code != exitOK {
			return code
		}
		defer p.Close()
		applied, err := sqlschema.Migrate(e.ctx, p, e.schema())
		if err != nil {
			switch {
			case errors.Is(err, sqlschema.ErrSchemaTooNew):
				return e.errorf(exitSchema, "%v: upgrade this queen binary", err)
			case errors.Is(err, sqlschema.ErrChecksumMismatch):
				return e.errorf(exitSchema, "%v: the database was migrated by another build of queen", err)
			}
			return e.fail(err)
		}
		if e.o.citus {
			if err := sqlschema.Distribute(e.ctx, p, e.schema()); err != nil {
				if errors.Is(err, sqlschema.ErrNoCitus) {
					return e.errorf(exitError, "%v: --citus needs a Citus coordinator", err)
				}
				return e.fail(err)
			}
		}
		if applied == nil {
			applied = []int{}
		}
		if e.o.json {
			return e.writeJSON(struct {
				Schema  string `json:"schema"`
				Applied []int  `json:"applied"`
				Version int    `json:"version"`
				Citus   bool   `json:"citus,omitempty"`
			}{e.schema(), applied, sqlschema.Latest(), e.o.citus})
		}
		if e.o.citus {
			defer fmt.Fprintf(e.stdout, "schema %q is distributed across the Citus workers\n", e.schema())
		}
		if len(applied) == 0 {
			fmt.Fprintf(e.stdout, "schema %q is up to date at version %d\n", e.schema(), sqlschema.Latest())
			return exitOK
		}
		ms := sqlschema.Migrations()
		for _, v := range applied {
			fmt.Fprintf(e.stdout, "applied %03d_%s\n", v, ms[v-1].Name)
		}
		fmt.Fprintf(e.stdout, "schema %q is at version %d\n", e.schema(), sqlschema.Latest())
		return exitOK
	},
}

var cmdMigrateGet = &command{
	name:     "migrate-get",
	synopsis: "[--from N] [--to N | --version N]",
	short:    "print migrations' SQL for your own migration tool",
	long: `Prints the SQL of migrations (from, to] rendered for --schema, as one script that
also maintains the schema_migrations table, for teams that apply SQL with their
own tool; up to the latest version it ends with the function layer (every
function and view, recorded in schema_functions). Needs no database.
--version N prints migration N alone.`,
	flags: func(fs *flag.FlagSet, o *opts) {
		fs.IntVar(&o.from, "from", 0, "the version the database is at; print the migrations after it")
		fs.IntVar(&o.to, "to", 0, "the last version to print (default the latest)")
		fs.IntVar(&o.version, "version", 0, "print this one migration")
	},
	run: func(e *env, fs *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 0); !ok {
			return code
		}
		if err := sqlschema.ValidSchema(e.schema()); err != nil {
			return e.usageError("--schema: %v", err)
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		from, to := e.o.from, e.o.to
		if !set["to"] {
			to = sqlschema.Latest()
		}
		if set["version"] {
			if set["from"] || set["to"] {
				return e.usageError("--version cannot be combined with --from or --to")
			}
			if e.o.version < 1 || e.o.version > sqlschema.Latest() {
				return e.usageError("no migration %d: versions run from 1 to %d", e.o.version, sqlschema.Latest())
			}
			from, to = e.o.version-1, e.o.version
		}
		if from < 0 || to > sqlschema.Latest() || from > to {
			return e.usageError("no migrations (%d, %d]: versions run from 1 to %d", from, to, sqlschema.Latest())
		}
		sql, err := sqlschema.Script(e.schema(), from, to)
		if err != nil {
			return e.usageError("%v", err)
		}
		if e.o.json {
			var vs []migrationJSON
			for _, m := range sqlschema.Migrations()[from:to] {
				vs = append(vs, migrationJSON{m.Version, m.Name, m.Checksum})
			}
			return e.writeJSON(struct {
				Schema     string          `json:"schema"`
				From       int             `json:"from"`
				To         int             `json:"to"`
				Migrations []migrationJSON `json:"migrations"`
				SQL        string          `json:"sql"`
			}{e.schema(), from, to, vs, sql})
		}
		fmt.Fprint(e.stdout, sql)
		return exitOK
	},
}

type migrationJSON struct {
	Version  int    `json:"version"`
	Name     string `json:"name"`
	Checksum string `json:"checksum"`
}

var cmdValidate = &command{
	name:  "validate",
	short: "check that the schema is at this binary's version",
	long: `Exits 0 when the schema has exactly this binary's migrations, 4 when some are
pending, the schema is missing or newer, or an applied migration differs.`,
	run: func(e *env, _ *flag.FlagSet, pos []string) int {
		if code, ok := e.args(pos, 0); !ok {
			return code
		}
		p, code := e.pool(2)
		if code != exitOK {
			return code
		}
		defer p.Close()
		st, err := readSchemaState(e.ctx, p, e.schema())
		if err != nil {
			return e.fail(err)
		}
		if e.o.json {
			if code := e.writeJSON(st); code != exitOK {
				return code
			}
		} else if st.OK {
			fmt.Fprintf(e.stdout, "schema %q is up to date at version %d\n", st.Schema, st.Version)
		} else {
			ms := sqlschema.Migrations()
			var names []string
			for _, v := range st.Pending {
				names = append(names, fmt.Sprintf("%03d_%s", v, ms[v-1].Name))
			}
			fmt.Fprintf(e.stdout, "schema %q is at version %d; this binary has %d\n", st.Schema, st.Version, st.Latest)
			if len(names) > 0 {
				fmt.Fprintf(e.stdout, "pending: %s\n", strings.Join(names, ", "))
			}
		}
		if !st.OK {
			return e.errorf(exitSchema, "%s: %s", st.Problem, st.Hint)
		}
		return exitOK
	},
}
