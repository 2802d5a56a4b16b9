#!/usr/bin/env bash
# The CUDA path on a machine with a GPU, in one go (docs/results.md, "The CUDA
# path on a GPU"):
#   1. the CUDA tests (tests/gpu: placement, pinned transfers, bf16 autocast,
#      no host synchronisation per step, evaluation equal to the CPU's);
#   2. python -m benchmarks.fleet --real on tinylm with a larger transformer, the same
#      run three ways side by side: GPU bf16 autocast, GPU fp32, CPU.
# Every figure names the device it came from. Nothing else in vcdl needs a GPU.
#
#   bash benchmarks/gpu.sh                 # results in ./gpu-results
#   OUT=/somewhere EPOCHS=1 bash benchmarks/gpu.sh
#
# Knobs (environment): PYTHON (python3), OUT (gpu-results), EPOCHS (2),
# WORKERS (2), MODEL (the transformer's kwargs), CPU_TIMEOUT (seconds for the
# CPU run, which is slow: 300), DEVICES ("cuda cpu": which rows to run).
set -u
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-results}
EPOCHS=${EPOCHS:-2}
WORKERS=${WORKERS:-2}
MODEL=${MODEL:-"{layers=6,heads=8,width=512}"}
CPU_TIMEOUT=${CPU_TIMEOUT:-300}
DEVICES=${DEVICES:-"cuda cpu"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
fi
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.cuda.is_available())' | tee -a "$OUT/gpu.txt"

# --noconftest: the CUDA tests need none of the suite's services (PostgreSQL, S3).
"$PY" -m pytest -q --noconftest -p no:cacheprovider -rs tests/gpu 2>&1 | tee "$OUT/gpu-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

fleet() { # device amp [timeout]
    timeout "${3:-900}" "$PY" -m benchmarks.fleet --real examples/tinylm.toml \
        --workers "$WORKERS" --processes "$WORKERS" --shards-per-worker 2 \
        --set "run.epochs=$EPOCHS" --set "model.kwargs=$MODEL" \
        --set "train.device=$1" --set "train.amp=$2" 2>"$OUT/fleet-$1-$2.err" |
        tee -a "$OUT/fleet.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; tail -20 "$OUT/fleet-$1-$2.err"; }
}
for d in $DEVICES; do
    case $d in
    cuda) fleet cuda true; fleet cuda false ;;
    cpu) fleet cpu false "$CPU_TIMEOUT" ;;
    esac
done
grep '^{' "$OUT/fleet.log" >"$OUT/fleet.jsonl"
exit $status
