"""A Marian Transformer beside its import, sentence by sentence: marian-decoder's n-best lists,
scores, soft and hard alignments against the served bundle's.

    python -m benchmarks.importing.transformer_exact_marian --sentences 500 [--json PATH]
    python -m benchmarks.importing.transformer_exact_marian --model M.npz --vocabs S.spm T.spm \
        --source held-out.txt [--bundle B] [--sentences 500] [--json PATH]

Without --model, a 2 + 2 layer Transformer is trained here by Marian (pymarian) on the generated
reversal task (export/toolkits/marian_toolkit.py), its alignment layer the first, and the
sentences are drawn from the task's generator with another seed, none of them a training line.
marian-decoder decodes each sentence alone (its maximum length counts the widest source of a
mini-batch), beam 5, `--n-best`, once with `--alignment soft` and once with `--alignment hard`;
the bundle is served (Engine, host search, the bundle's decoding defaults: marian-decoder's
rules) at beam 5, n-best 5, in batches of 32. Counted: the best translation equal, the whole
n-best list equal (texts in order), the largest score difference on equal lists (marian-decoder
prints 6 significant digits) and how many scores are within 1e-4 or half its last printed digit,
the largest soft-alignment difference, and the hypotheses whose hard alignment (each target
token's largest source weight, the `</s>` row aside) is marian-decoder's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.importing.transformer_exact import BEAM, served_nbest


@dataclass
class Figures:
    sentences: int
    hypotheses: int
    same_best: int
    same_nbest: int
    max_score_diff: float
    scores_within_tolerance: int
    max_soft_alignment_diff: float
    same_hard_alignment: int
    seconds_marian: float
    seconds_ours: float
    differences: list[dict[str, Any]]


def tiny_model(root: Path, count: int) -> tuple[Path, tuple[Path, Path], list[str]]:
    """The reversal task's Transformer, trained here, and `count` held-out sources."""
    from export.toolkits import marian_toolkit as mt

    model = mt.train_demo(root, options=("--transformer-guided-alignment-layer", "1"),
                          kind="transformer", n_test=count * 3, after="20e")  # fmt: skip
    task = root / "task"
    seen = set((task / "train.src").read_text(encoding="utf-8").splitlines())
    held = mt.make_subword_task(root / "held", n_train=1, n_test=count * 3, seed=7)
    lines = (held / "test.src").read_text(encoding="utf-8").splitlines()
    texts = [t for t in dict.fromkeys(lines) if t not in seen][:count]
    vocab = model.parent / "vocab.spm"
    return model, (vocab, vocab), texts


def measure(model: Path, vocabs: tuple[Path, Path], bundle: Path, texts: list[str],
            work: Path) -> Figures:  # fmt: skip
    from export.toolkits import marian_toolkit as mt

    source = work / "source.txt"
    source.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    start = time.perf_counter()
    soft = mt.read_nbest(mt.decode(model, vocabs, source, work / "soft.nbest", BEAM, n_best=True,
                                   alignment="soft"))  # fmt: skip
    seconds_marian = time.perf_counter() - start
    hard = mt.read_nbest(mt.decode(model, vocabs, source, work / "hard.nbest", BEAM, n_best=True,
                                   alignment="hard"))  # fmt: skip
    got, seconds_ours = served_nbest(bundle, texts, threads=1)
    figures = Figures(len(texts), 0, 0, 0, 0.0, 0, 0.0, 0, seconds_marian, seconds_ours, [])
    for text, translation, theirs, theirs_hard in zip(texts, got, soft, hard, strict=True):
        ours = [h.text for h in translation.hypotheses]
        figures.same_best += ours[0] == theirs[0].text
        if ours != [h.text for h in theirs]:
            figures.differences.append({"source": text, "ours": ours,
                                        "marian": [h.text for h in theirs]})  # fmt: skip
            continue
        figures.same_nbest += 1
        for hyp, their, their_hard in zip(translation.hypotheses, theirs, theirs_hard, strict=True):
            assert hyp.alignment is not None
            figures.hypotheses += 1
            diff = abs(hyp.score - their.score)
            figures.max_score_diff = max(figures.max_score_diff, diff)
            figures.scores_within_tolerance += diff <= mt.score_tolerance(their.score)
            matrix = np.asarray(hyp.alignment.matrix, dtype=np.float64)
            rows = mt.soft_alignment(their.alignment)[: len(matrix)]
            if matrix.size:
                figures.max_soft_alignment_diff = max(
                    figures.max_soft_alignment_diff, float(np.abs(matrix - rows).max())
                )
            marian_links = {link for link in their_hard.alignment.split()
                            if int(link.split("-")[1]) < len(matrix)}  # fmt: skip
            figures.same_hard_alignment += mt.hard_links(matrix) == marian_links
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--model", type=Path, help="a Marian Transformer model.npz")
    parser.add_argument("--vocabs", type=Path, nargs=2)
    parser.add_argument("--source", type=Path, help="held-out sources, one a line")
    parser.add_argument("--bundle", type=Path, help="its import (made here when not given)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from export.importers.marian import import_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model is None:
            model, vocabs, texts = tiny_model(work, args.sentences)
            label = "tiny reversal Transformer trained here (2 + 2 layers, 32 wide)"
        else:
            model, vocabs = args.model, (args.vocabs[0], args.vocabs[1])
            texts = args.source.read_text(encoding="utf-8").splitlines()[: args.sentences]
            label = str(args.model)
        bundle = args.bundle or import_model(model, vocabs, work / "bundle", "exact", "1")
        figures = measure(model, vocabs, bundle, texts, work)
    summary = {k: v for k, v in asdict(figures).items() if k != "differences"}
    print(json.dumps({"model": label, **summary, "differing": len(figures.differences)}, indent=1))
    if args.json:
        args.json.write_text(
            json.dumps({"format": "marian", "model": label, **asdict(figures)}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
