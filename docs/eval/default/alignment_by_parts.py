"""The default model's attention against gold on the test split, by phrase count.

    python docs/eval/default/alignment_by_parts.py

Forced decoding of the references (export/evaluate/alignment_eval.py, as `s2s-evaluate --gold`), once for
the sentences of 1-3 phrases (the lengths the model was trained on, and what the server decodes
after segmentation) and once for the longer ones, decoded whole.
"""

from collections.abc import Callable

import torch

from export.data.corpus import read_tsv
from export.data.gold import GoldLinks, read_gold
from export.evaluate.alignment_eval import evaluate_alignments
from export.train.checkpoint import load_checkpoint
from service.model.tokenizer import Tokenizer

FIGURES = ("phrase_accuracy", "word_accuracy", "aer", "off_by_plus_one", "off_by_minus_one")
GROUPS: tuple[tuple[str, Callable[[GoldLinks], bool]], ...] = (
    ("1-3 phrases (trained)", lambda g: g.parts <= 3),
    ("4+ phrases (beyond)", lambda g: g.parts > 3),
)


def main() -> None:
    torch.set_num_threads(1)
    model, _ = load_checkpoint("models/default.pt")
    src = Tokenizer.load("models/default/source.model")
    tgt = Tokenizer.load("models/default/target.model")
    pairs, gold = read_tsv("docs/eval/test.tsv"), read_gold("docs/eval/test.gold.jsonl")
    for name, keep in GROUPS:
        idx = [i for i, g in enumerate(gold) if keep(g)]
        report = evaluate_alignments(
            model, src, tgt, [pairs[i] for i in idx], [gold[i] for i in idx]
        )
        overall = report.get("overall", report)
        print(name, len(idx), {k: overall.get(k) for k in FIGURES})


if __name__ == "__main__":
    main()
