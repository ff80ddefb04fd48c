#!/usr/bin/env bash
# Rebuild the embedded default model from scratch: corpus → train → evaluate → export → audit →
# confidence threshold → bundle with that threshold.
# Training: 2,400 steps on 1 torch thread, about 27-33 minutes on this project's shared 2-core
# machine (see configs/default.toml). Needs the train extra: bash scripts/install.sh dev,train
#   RUN=runs/default (default) the run folder; SKIP_TRAIN=1 reuses a run already trained there.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
run=${RUN:-runs/default}
if [ -z "${SKIP_TRAIN:-}" ]; then
  s2s-train --config configs/default.toml --out "$run"
fi
# greedy PyTorch figures and the attention's agreement with the gold links (test.gold.jsonl beside
# the test split: forced decoding of the references)
s2s-evaluate --checkpoint "$run/best.pt" --tokenizers "$run" --test "$run/data/test.tsv" \
  --train "$run/data/train.tsv" --bucket-edges 10,20,30,40,50,60 \
  --heatmap-text "ninety-seven and march 5, 2021, then \$1,250.50" \
  --label "cgru + guided alignment (default)" --out docs/eval/default
python - <<'PY'
import json
m = json.load(open("docs/eval/default/metrics.json"))
summary = {k: m["overall"][k] for k in ("bleu", "chrf", "exact_match")} if "overall" in m else {}
description = (
    "English numbers, dates, times and amounts (words or digits, e.g. \"ninety-seven\", "
    "\"March 5, 2021\", \"$1,250.50\") to French; other text is outside its domain"
)
json.dump({"test_greedy": summary, "corpus": "generated en-fr numbers (export.data.corpus, seed 1)", "description": description}, open("docs/eval/default/metrics_summary.json", "w"))
PY
export_bundle() {
  s2s-export --checkpoint "$run/best.pt" --tokenizers "$run" --out models/default \
    --name numbers-en-fr --version 2.0.0 --int8 --info docs/eval/default/metrics_summary.json \
    --segmentation configs/numbers-segmentation.json "$@"
}
export_bundle
# the audit as served (fresh seed, every family, every length up to the 256-token limit)
python -m export.data.audit_set --bundle models/default --out "$run/audit" --seed 101 \
  --per-family 100 --per-bucket 100 --exclude "$run/data/train.tsv"
python -m benchmarks.quality.audit --bundle models/default --audit "$run/audit/audit.tsv" \
  --json docs/eval/audit.json --markdown docs/eval/audit.md
# the confidence threshold that keeps 99% of accepted answers right, written into the bundle
python -m benchmarks.quality.confidence --bundle models/default --json docs/eval/confidence.json
threshold=$(python -c "import json; print(json.load(open('docs/eval/confidence.json'))['by_confidence']['confidence']['threshold'])")
export_bundle --min-confidence "$threshold"
cp "$run/best.pt" models/default.pt
cp "$run/data/test.tsv" docs/eval/test.tsv  # sources lower-cased when [data] lowercase_source
cp "$run/data/test.gold.jsonl" docs/eval/test.gold.jsonl
