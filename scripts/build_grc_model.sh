#!/usr/bin/env bash
# Rebuild the Greek New Testament → English model (models/grc-en-nt) from the data of the PyPI
# package bible-alignments 0.4.2: verse pairs and gold links → two training stages with guided
# alignment → ONNX bundle with the parity check → BLEU/chrF on John (served, beam 5, the model's
# decoding defaults) → the link head (Align's supervised aligner) → attention against the dev
# split's gold links. Stage 2 is exported with its decoder averaged with stage 1's best
# (export/train/average.py).
# Stage 1 (configs/grc-en-nt.toml): 2,000 steps, 55 minutes here on a shared 2-core machine
# (1 torch thread); stage 2 (configs/grc-en-nt-align.toml): 750 steps, ~16 minutes; evaluation ~5;
# the link head (stage 2's [link_head]): a teacher of two members (10 epochs each), then one head
# distilled from it (12 epochs), 1.5-7 minutes an epoch (contention): 101 minutes here.
# Needs the train extra: bash scripts/install.sh dev,train
#   RUN=runs/grc-en-nt (default) stage 1's run folder (stage 2's is $RUN-align; stage 2's config
#   reads stage 1 from runs/grc-en-nt); SKIP_TRAIN=1 exports and evaluates the runs already
#   trained there; RESUME=1 continues an interrupted stage 1 from its last.pt.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
run=${RUN:-runs/grc-en-nt}
python -m export.data.bible --out data/grc-en   # the paths the configs name
if [ -z "${SKIP_TRAIN:-}" ]; then
  flags=()
  [ -n "${RESUME:-}" ] && flags+=(--resume)
  s2s-train --config configs/grc-en-nt.toml --out "$run" "${flags[@]}"   # stage 1
  s2s-train --config configs/grc-en-nt-align.toml --out "$run-align" --train-only   # stage 2
fi
# the decoder averaged over the ends of both stages, the encoder of stage 2's best (chosen on dev:
# docs/model-grc-en.md), then export, parity check, John's scores and the link head
python -m export.train.average --encoder "$run-align/best.pt" \
  --average "$run-align/best.pt" "$run-align/last.pt" "$run/best.pt" --out "$run-align/averaged.pt"
s2s-train --config configs/grc-en-nt-align.toml --out "$run-align" --skip-train \
  --checkpoint averaged.pt --bundle models/grc-en-nt
# (that exported models/grc-en-nt, checked its parity, scored John and added the link head:
# $run-align/link_head/link_head.json)
# the attention's argmax links against the dev split's gold (forced decoding of the references)
s2s-evaluate --checkpoint "$run-align/best.pt" --tokenizers "$run-align" \
  --test "$run-align/data/dev.tsv" --gold "$run-align/data/dev.gold.jsonl" \
  --label "grc-en-nt, dev" --out docs/eval/grc-en-nt/dev
mkdir -p docs/eval/grc-en-nt
cp "$run-align/pipeline.json" docs/eval/grc-en-nt/pipeline.json
cp "$run-align/eval/metrics.json" docs/eval/grc-en-nt/test_metrics.json
cat "$run/train_log.jsonl" "$run-align/train_log.jsonl" > docs/eval/grc-en-nt/train_log.jsonl
du -sh models/grc-en-nt
# New bytes are a new version: python -m export.versions --release models/grc-en-nt --change "..."
# (models/versions.json records every released version; tests/test_versions.py checks it)
