#!/usr/bin/env bash
# Rebuild models/grc-en-nt-transformer, the Greek New Testament → English Transformer trained by
# Marian (docs/model-grc-en-transformer.md): the verse pairs and gold links of bible-alignments 0.4.2
# (the same splits as grc-en-nt: John held out, dev chooses the checkpoint) → SentencePiece models
# and the links remapped to their pieces → `marian train --type transformer` with guided alignment
# (export/toolkits/marian_guided.py; the shipped model: 4,500 updates, 58 minutes at one CPU thread
# then 32 at two, here) →
# s2s-import marian from the decoder.yml Marian wrote (its beam-size and normalize as the
# bundle's defaults), the best dev-BLEU checkpoint → dev BLEU/chrF/AER and John's.
# Needs the train and marian extras: bash scripts/install.sh dev,train,import,marian
#   RUN=runs/grc-en-transformer (default); UPDATES=4500 (Marian's --after, in updates)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
run=${RUN:-runs/grc-en-transformer}
out=models/grc-en-nt-transformer
python -m export.data.bible --out data/grc-en
python -m export.toolkits.marian_guided --data data/grc-en --out "$run" --updates "${UPDATES:-4500}"
rm -rf "$out"
s2s-import marian --config "$run/model.npz.decoder.yml" --model "$run/model.npz.best-bleu.npz" \
  --out "$out" --name grc-en-nt-transformer --version 1.1.0
mkdir -p docs/eval/grc-en-nt-transformer
for split in dev test; do
  python -m benchmarks.alignment.grc_en --bundle "$out" --split "$split" --no-eflomal --threads 1 \
    --json "docs/eval/grc-en-nt-transformer/$split.json"
done
du -sh "$out"
