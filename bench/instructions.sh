#!/usr/bin/env bash
# instructions.sh regenerates the instruction tables of BENCHMARKS.md: the
# Redis rows at 64 callers, 10 000 subjects, mostly allowed, once against a
# redis-server under valgrind's callgrind (instructions and socket events
# per decision, the batched floors beside), once against a plain one
# (decisions/s and CPU), then one table of both.
#
#   cd bench && ./instructions.sh [NAME]    # writes results/NAME.{cg.json,json,md}
#
# Needs valgrind (callgrind_control) and redis-server on PATH. Under
# callgrind Redis runs 20-50x slower: each cell is sized by count
# (-decisions), and the allowed mode's window is a minute so that a
# subject's state is still live when it comes back, as it is at full speed.
set -euo pipefail
name=${1:-$(date -u +%F)-instructions}
rows=${ROWS:-'(redisstore)|ulule|redis_rate|floor: (EVALSHA return 1$|.*batched)'}
common=(-callers 64 -subjects 10000 -mode allowed -http=false -limiters "$rows")
go build -o "${TMPDIR:-/tmp}/sluice-bench.$$" .
bin="${TMPDIR:-/tmp}/sluice-bench.$$"

# A redis-server under callgrind with instrumentation off until a cell
# starts, its dumps where -callgrind-pid looks for them
# ($TMPDIR/rediscg.PID, as ../shared/tools/rediscg makes it).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d "${TMPDIR:-/tmp}/rediscg.XXXXXX")
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$dir/valgrind.log" 2>&1 &
pid=$!
ln -sfn "$dir" "${TMPDIR:-/tmp}/rediscg.$pid"
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir" "${TMPDIR:-/tmp}/rediscg.$pid" "$bin"
}
trap cleanup EXIT
for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done

"$bin" "${common[@]}" -redis "127.0.0.1:$port" -callgrind-pid "$pid" -window 1m \
  -duration 10m -warmup 0 -decisions "${DECISIONS:-20000}" -json >"results/$name.cg.json"
"$bin" "${common[@]}" -duration 3s -warmup 1s -json >"results/$name.json"
"$bin" -render "results/$name.cg.json" -beside "results/$name.json" | tee "results/$name.md"
