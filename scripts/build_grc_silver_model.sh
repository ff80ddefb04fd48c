#!/usr/bin/env bash
# Rebuild models/grc-en-nt-silver, the Greek New Testament → English model trained with NO gold
# link (docs/align.md, "Aligning a corpus without gold"): the text of bible-alignments 0.4.2 only →
# stage 1 (configs/grc-en-nt-silver.toml): eflomal's grow-diag-final-and links guide a one-stage
# training (38 minutes, 1 thread), export, parity check, John's BLEU/chrF, a first link head →
# stage 2 (configs/grc-en-nt-silver-head.toml): the link head again on eflomal's links over word
# prefixes (10 minutes) → John's AER against the gold (read only to score).
# ~65 minutes on the shared 2-core machine. Needs the train extra: bash scripts/install.sh dev,train
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export OMP_NUM_THREADS=1
run=${RUN:-runs/grc-en-nt-silver}
python -m export.data.bible --out data/grc-en-text --no-links   # text only: no .pharaoh file
s2s-train --config configs/grc-en-nt-silver.toml --out "$run" --bundle models/grc-en-nt-silver
python -m export.link_head --config configs/grc-en-nt-silver-head.toml \
  --bundle models/grc-en-nt-silver --out "$run-head"
python -m export.data.bible --out data/grc-en   # the gold, for scoring only
python -m benchmarks.grc_en_silver --silver models/grc-en-nt-silver --gold models/grc-en-nt \
  --data data/grc-en --json docs/eval/grc-en-nt-silver/john.json
du -sh models/grc-en-nt-silver
