#!/usr/bin/env bash
# One benchmark round as docs/results.md reports it: every script in
# sequence, one at a time (nothing else should run on the machine), each
# script's output in LOGDIR/NAME.log and start/end times in LOGDIR/times.log.
#   benchmarks/round.sh [LOGDIR]        # default bench-logs/; ~65 min here
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${1:-bench-logs}"
mkdir -p "$logs"
py=.venv/bin/python
export PREFECT_SERVER_ANALYTICS_ENABLED=false
echo "commit $(git rev-parse --short HEAD) $(date -u +%F)" >>"$logs/times.log"
run() {
  local name=$1
  shift
  echo "START $name $(date -u +%H:%M:%S)" >>"$logs/times.log"
  "$py" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "END $name $(date -u +%H:%M:%S) rc=$rc" >>"$logs/times.log"
}
run allocator -m benchmarks.allocator
run overhead -m benchmarks.overhead --repeats 3
run overhead_kills -m benchmarks.overhead --repeats 3 --kill-every 15 --epochs 4
run task_engine -m benchmarks.task_engine
run weights_io -m benchmarks.weights_io
run ledger -m benchmarks.ledger
# Plain VC-ASGD (alpha 0.3, docs/design.md §1) and the example's delta rule
# with a constant alpha, each beside the example's config as shipped.
vcasgd=merge.rule=vc_asgd,merge.schedule=constant,merge.staleness=plain,merge.staleness_grace=0
constant=merge.schedule=constant
run tta_a -m benchmarks.time_to_accuracy --parts a --repeats 3 \
  --vcdl-also "$vcasgd" --vcdl-also "$constant"
run rules_mnist1d -m benchmarks.rules --workloads mnist1d
run rules_tinylm -m benchmarks.rules --workloads tinylm --epochs 6
run tta_b -m benchmarks.time_to_accuracy --parts b --repeats-b 3 \
  --vcdl-also "$vcasgd" --vcdl-also "$constant"
# Part (a) again, 7 runs: 3 runs' medians cannot tell a 10 % difference from
# the runs' spread (one run to the next differs by up to 1.5x).
run tta_a7 -m benchmarks.time_to_accuracy --parts a --repeats 7 --vcdl-also "$vcasgd"
echo "DONE $(date -u +%H:%M:%S)" >>"$logs/times.log"
