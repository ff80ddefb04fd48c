#!/usr/bin/env bash
# Rebuild the embedded default model from scratch: corpus → train → evaluate → export bundle.
# About 17 minutes of training on 2 CPU cores (1 torch thread; see configs/default.toml).
# Needs the train extra: bash scripts/install.sh dev,train
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
run=runs/default
s2s-train --config configs/default.toml --out "$run"
s2s-evaluate --checkpoint "$run/best.pt" --tokenizers "$run" --test "$run/data/test.tsv" \
  --train "$run/data/train.tsv" --bucket-edges 10,20,30,40,50,60,69 --heatmap-text "ninety-seven and march 5, 2021, then \$1,250.50" \
  --label "additive attention (default)" --out docs/eval/default
python - <<'PY'
import json
m = json.load(open("docs/eval/default/metrics.json"))
summary = {k: m["overall"][k] for k in ("bleu", "chrf", "exact_match")} if "overall" in m else {}
json.dump({"test_greedy": summary, "corpus": "generated en-fr numbers (export.corpus, seed 1)"}, open("docs/eval/default/metrics_summary.json", "w"))
PY
s2s-export --checkpoint "$run/best.pt" --tokenizers "$run" --out models/default \
  --name numbers-en-fr --version 1.0.0 --int8 --info docs/eval/default/metrics_summary.json \
  --segmentation configs/numbers-segmentation.json
cp "$run/best.pt" models/default.pt
cp "$run/data/test.tsv" docs/eval/test.tsv  # sources lower-cased when [data] lowercase_source
cp "$run/data/test.gold.jsonl" docs/eval/test.gold.jsonl
