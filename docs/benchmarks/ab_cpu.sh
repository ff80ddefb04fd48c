#!/usr/bin/env bash
# CPU throughput, before and after, interleaved: ROUNDS rounds of [base, new] × [serving loop
# (iteration policy), decode variant (a)]. BASE and NEW are two checkouts (git archive of each commit,
# with the proto stubs copied in); the realistic bundle is exported once beforehand:
#   python docs/benchmarks/ab_decode_a.py --export /tmp/realistic
# Usage: BASE=/tmp/base NEW=/tmp/new OUT=/tmp/ab ROUNDS=3 bash docs/benchmarks/ab_cpu.sh
set -u
PY=${PY:-python}
OUT=${OUT:-/tmp/ab}; ROUNDS=${ROUNDS:-3}; REALISTIC=${REALISTIC:-/tmp/realistic}
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1
for round in $(seq 1 "$ROUNDS"); do
  for side in base new; do
    if [ "$side" = base ]; then dir=$BASE; else dir=$NEW; fi
    (cd "$dir" && PYTHONPATH=$dir $PY -m benchmarks.serving_loop --seconds 10 --policy iteration \
      > "$OUT/loop_${side}_$round.txt" 2>&1)
    (cd "$dir" && PYTHONPATH=$dir $PY "$dir/docs/benchmarks/ab_decode_a.py" --realistic "$REALISTIC" \
      > "$OUT/decode_${side}_$round.txt" 2>&1)
  done
done
