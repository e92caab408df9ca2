#!/usr/bin/env bash
# Runs the history checker against the tree this script lives in with each
# patch applied (a fixed defect put back), one scratch copy per patch.
#
#   internal/history/teeth/run.sh [patch...]   (default: every *.patch here)
#
# Env: TEETH_SEED, TEETH_DURATION  a soak (-seed N -duration D) instead of the CI seeds
#      TEETH_TIMEOUT               go test -timeout (default 20m)
#      TEETH_LOGS                  where each run's log is kept (default $TMPDIR/teeth-logs)
#      TEETH_KEEP=1                keep scratch copies and the checker's history dirs
# A patch whose header has a line "Run: -race" runs with -race.
#
#      run.sh --parse LOG...       re-read the verdicts of earlier runs' logs
# Output, one line per patch (tab-separated):
#   name  caught(yes/no/ERROR)  first violation kind  seconds  log
# seconds: the checker's own time (its subtests' durations) up to the end of
# the first failing one; build and cluster start not counted.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
[ -f "$root/go.mod" ] || { echo "teeth: no go.mod at $root" >&2; exit 2; }
logs=${TEETH_LOGS:-${TMPDIR:-/tmp}/teeth-logs}
mkdir -p "$logs"
if [ $# -eq 0 ]; then set -- "$here"/*.patch; fi
args=(-count=1 -v -timeout "${TEETH_TIMEOUT:-20m}" -run 'TestHistory$')
# The checker's own flags go after the package: before it, go test would
# take them for its own and test the root package.
own=()
if [ -n "${TEETH_SEED:-}" ]; then own+=(-seed "$TEETH_SEED"); fi
if [ -n "${TEETH_DURATION:-}" ]; then own+=(-duration "$TEETH_DURATION"); fi

# verdict RC LOG prints "caught<TAB>kind<TAB>seconds" for a checker log.
verdict() {
	awk -v rc="$1" '
		/^    --- (PASS|FAIL): TestHistory\// {
			d = $NF; gsub(/[()s]/, "", d); t += d
			if ($2 == "FAIL:" && !failed) { failed = 1; secs = t }
		}
		!kind && match($0, /: seed [0-9]+: [a-z][a-z-]*: /) {
			s = substr($0, RSTART, RLENGTH); sub(/^: seed [0-9]+: /, "", s); sub(/: $/, "", s); kind = s
		}
		/run_test\.go:[0-9]+: child history .*no such file/ { flake = 1; next }
		!fatal && /^panic: |test timed out/ { fatal = $0 }
		!fatal && /run_test\.go:[0-9]+: .*(not drained|did not end|child history|maintenance off|start child)/ { fatal = $0 }
		/^--- FAIL: TestHistory/ { top = 1 }
		END {
			if (!kind && fatal) { sub(/^ +/, "", fatal); kind = "fatal: " substr(fatal, 1, 80) }
			if (!kind && flake) { printf "no\t- (harness flake: child history missing)\t-"; exit }
			if (failed || top || rc != 0) {
				if (!kind) kind = "failed (see log)"
				printf "yes\t%s\t%s", kind, (failed ? secs : "-")
			} else printf "no\t-\t-"
		}' "$2"
}

# --parse LOG...: the verdicts of earlier runs' logs, without running anything.
if [ "${1:-}" = --parse ]; then
	shift
	for log in "$@"; do
		rc=0; grep -q '^FAIL' "$log" && rc=1
		printf '%s\t%s\t%s\n' "$(basename "$log" .log)" "$(verdict "$rc" "$log")" "$log"
	done
	exit 0
fi

status=0
for p in "$@"; do
	p=$(cd "$(dirname "$p")" && pwd)/$(basename "$p")
	name=$(basename "$p" .patch)
	log=$logs/$name.log
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/teeth-$name.XXXXXX")
	(cd "$root" && tar --exclude=./.git -cf - .) | tar -xf - -C "$tmp"
	extra=()
	if sed '/^diff --git/,$d' "$p" | grep -q '^Run: .*-race'; then extra+=(-race); fi
	{
		echo "# $name $(date -u +%FT%TZ) tree $root $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
		echo "# go test ${args[*]} ${extra[*]} ./internal/history ${own[*]}"
	} >"$log"
	if ! (cd "$tmp" && git apply --whitespace=nowarn "$p") >>"$log" 2>&1; then
		printf '%s\tERROR\tpatch does not apply\t-\t%s\n' "$name" "$log"
		status=1; [ -n "${TEETH_KEEP:-}" ] || rm -rf "$tmp"; continue
	fi
	if ! (cd "$tmp" && go build ./...) >>"$log" 2>&1; then
		printf '%s\tERROR\tdoes not build\t-\t%s\n' "$name" "$log"
		status=1; [ -n "${TEETH_KEEP:-}" ] || rm -rf "$tmp"; continue
	fi
	(cd "$tmp" && go test "${extra[@]}" "${args[@]}" ./internal/history "${own[@]}") >>"$log" 2>&1
	rc=$?
	# The checker's result: the first failing subtest and its first violation.
	# A child killed before it wrote its history file fails the run without
	# a violation (a harness flake under load, seen without any patch): not
	# a catch.
	res=$(verdict "$rc" "$log")
	printf '%s\t%s\t%s\n' "$name" "$res" "$log"
	if [ -z "${TEETH_KEEP:-}" ]; then
		# The checker keeps a failing run's history directory; the log has the rest.
		grep -o 'history kept in [^ ]*' "$log" | awk '{print $4}' | while read -r d; do
			case $d in */queen-history-*) rm -rf "$d" ;; esac
		done
		rm -rf "$tmp"
	fi
done
exit $status
