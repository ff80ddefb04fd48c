#!/usr/bin/env bash
# Rebuild the Greek New Testament → English model (models/grc-en-nt) from the data of the PyPI
# package bible-alignments 0.4.2: verse pairs and gold links → training with guided alignment →
# ONNX bundle with the parity check → BLEU/chrF on John (served, beam 5) → attention AER on dev.
# About 50 minutes of training plus ~5 of evaluation on a shared 2-core machine (1 torch thread;
# see configs/grc-en-nt.toml). Needs the train extra: bash scripts/install.sh dev,train
#   RUN=runs/grc-en-nt (default) the run folder; SKIP_TRAIN=1 exports and evaluates a run already
#   trained there; RESUME=1 continues an interrupted run from its last.pt.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
run=${RUN:-runs/grc-en-nt}
python -m export.data.bible --out data/grc-en   # the paths configs/grc-en-nt.toml names
flags=()
[ -n "${SKIP_TRAIN:-}" ] && flags+=(--skip-train)
[ -n "${RESUME:-}" ] && flags+=(--resume)
# train, export to models/grc-en-nt, parity check, BLEU/chrF on John (served, beam 5; PyTorch greedy)
s2s-train --config configs/grc-en-nt.toml --out "$run" --bundle models/grc-en-nt "${flags[@]}"
# the attention's argmax links against the dev split's gold (forced decoding of the references)
s2s-evaluate --checkpoint "$run/best.pt" --tokenizers "$run" --test "$run/data/dev.tsv" \
  --gold "$run/data/dev.gold.jsonl" --label "grc-en-nt, dev" --out docs/eval/grc-en-nt/dev
mkdir -p docs/eval/grc-en-nt
cp "$run/pipeline.json" docs/eval/grc-en-nt/pipeline.json
cp "$run/eval/metrics.json" docs/eval/grc-en-nt/test_metrics.json
cp "$run/train_log.jsonl" docs/eval/grc-en-nt/train_log.jsonl
du -sh models/grc-en-nt
