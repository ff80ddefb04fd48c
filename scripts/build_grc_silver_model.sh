#!/usr/bin/env bash
# Rebuild models/grc-en-nt-silver, the Greek New Testament → English model trained with NO gold
# link (docs/align.md, "Aligning a corpus without gold"): the text of bible-alignments 0.4.2 only →
# configs/grc-en-nt-silver.toml: the teacher (eflomal over word prefixes, 5 runs voting, unaligned
# English words attached; ~2 minutes) guides the attention of one training stage (6,000 steps at
# most: ~3 hours at one CPU thread; the shipped 1.1.0 trained 5,925 steps in 11 minutes on an
# NVIDIA H200, where s2s-train uses CUDA by itself), export, parity check, John's BLEU/chrF, the
# link head on the same links (~8 minutes) → John's AER against the gold (read only to score).
# Needs the train extra: bash scripts/install.sh dev,train
# MAX_MINUTES=11 stops training at that wall-clock time (the shipped run's budget on the H200).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export OMP_NUM_THREADS=1
run=${RUN:-runs/grc-en-nt-silver}
python -m export.data.bible --out data/grc-en-text --no-links   # text only: no .pharaoh file
s2s-train --config configs/grc-en-nt-silver.toml --out "$run" --bundle models/grc-en-nt-silver \
  ${MAX_MINUTES:+--max-minutes "$MAX_MINUTES"}
python -m export.data.bible --out data/grc-en   # the gold, for scoring only
python -m benchmarks.alignment.grc_en_silver --silver models/grc-en-nt-silver --gold models/grc-en-nt \
  --data data/grc-en --json docs/eval/grc-en-nt-silver/john.json
du -sh models/grc-en-nt-silver
