"""Our G2P bundle against `g2p_en`'s neural predictor on the same test words: accuracy and words/s,
measured side by side in one run (a script that prints figures, not a test).

    python -m benchmarks.quality.g2p_en --bundle models/g2p --test runs/g2p/data/test.tsv \
        [--g2p-en /path/holding/g2p_en] [--speed-words 2000] [--json docs/eval/g2p/g2p_en.json]

What is measured of g2p_en (2.1.0, `pip install --no-deps g2p-en==2.1.0`): its `G2p.predict(word)`,
the package's own numpy GRU encoder-decoder (no attention, greedy, one word per call) on its packaged
checkpoint20.npz. Its `G2p.__call__` would look most words up in NLTK's copy of CMUdict first and
would download NLTK data at import; neither happens here: `nltk` and `inflect` are replaced by inert
stand-ins before the import (they only serve the lookup, the POS tagger and number spelling), so every
word goes through the neural predictor. g2p_en was trained on CMUdict, very likely including many of
our test words, so its accuracy here is optimistic.

Ours: the serving engine (ONNX Runtime decoder step + numpy beam search) on the bundle, words batched
(--batch words per call), beam 1 and beam 5. Both sides get one thread (OpenBLAS/OMP for numpy, one
intra-op thread for ONNX Runtime), and take turns in every timing round
(benchmarks.decoding.decode's best_of_interleaved).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads: one thread per side, like the engine's

import argparse  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks.decoding.decode import best_of_interleaved  # noqa: E402
from export.data.corpus import read_tsv  # noqa: E402
from export.evaluate.g2p_eval import cpu_engine, decode_engine, score_both  # noqa: E402
from export.metrics.g2p_metrics import references  # noqa: E402

G2P_EN = "g2p_en (one word per call)"


def _stub_modules() -> None:
    """Inert `nltk` and `inflect`: g2p_en imports them at module level for what we bypass."""
    nltk = types.ModuleType("nltk")
    nltk.pos_tag = lambda words: [(w, "NN") for w in words]  # type: ignore[attr-defined]
    nltk.download = lambda *a, **k: False  # type: ignore[attr-defined]
    nltk.data = types.SimpleNamespace(find=lambda *a, **k: True)  # type: ignore[attr-defined]
    corpus = types.ModuleType("nltk.corpus")
    corpus.cmudict = types.SimpleNamespace(dict=dict)  # type: ignore[attr-defined]  # empty lookup
    tokenize = types.ModuleType("nltk.tokenize")

    class TweetTokenizer:
        def tokenize(self, text: str) -> list[str]:
            return text.split()

    tokenize.TweetTokenizer = TweetTokenizer  # type: ignore[attr-defined]
    inflect = types.ModuleType("inflect")
    inflect.engine = lambda: None  # type: ignore[attr-defined]
    for name, module in (
        ("nltk", nltk),
        ("nltk.corpus", corpus),
        ("nltk.tokenize", tokenize),
        ("inflect", inflect),
    ):
        sys.modules.setdefault(name, module)


def load_g2p_en(folder: Path | None) -> Callable[[str], list[str]]:
    """g2p_en's neural predictor, `predict(word) -> phonemes`, from `folder` (holding g2p_en/)."""
    if folder is not None:
        sys.path.insert(0, str(folder))
    if importlib.util.find_spec("g2p_en") is None:
        raise SystemExit(
            "g2p_en is not installed: pip install --no-deps --target DIR g2p-en==2.1.0, then --g2p-en DIR"
        )
    _stub_modules()
    from g2p_en import G2p  # type: ignore[import-not-found]

    g2p = G2p()
    return g2p.predict  # type: ignore[no-any-return]


def g2p_en_words(predict: Callable[[str], list[str]], words: Sequence[str]) -> dict[str, str]:
    return {w: " ".join(predict(w)) for w in words}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/g2p"))
    p.add_argument("--test", type=Path, required=True, help="word<TAB>phonemes test split")
    p.add_argument("--g2p-en", type=Path, help="folder holding the g2p_en package")
    p.add_argument("--speed-words", type=int, default=2000, help="test words timed per round")
    p.add_argument("--batch", type=int, default=256, help="words per engine call")
    p.add_argument("--repeats", type=int, default=3, help="timing rounds (best kept)")
    p.add_argument("--int8", action="store_true", help="time the bundle's int8 decoder too")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)

    refs = references(read_tsv(args.test))
    words = list(refs)  # the split's own (shuffled) order
    predict = load_g2p_en(args.g2p_en)
    accuracy = score_both(refs, g2p_en_words(predict, words))
    engine = cpu_engine(args.bundle, int8=False, threads=1)
    engines = {"fp32": engine}
    if args.int8:
        engines["int8"] = cpu_engine(args.bundle, int8=True, threads=1)

    timed = words[: args.speed_words]
    fns: dict[str, Callable[[], object]] = {G2P_EN: lambda: g2p_en_words(predict, timed)}
    for kind, eng in engines.items():
        for beam in (1, 5):
            fns[f"ours, {kind}, beam {beam}, batch {args.batch}"] = functools.partial(
                decode_engine, eng, timed, beam, args.batch
            )
    best = best_of_interleaved(fns, args.repeats)  # type: ignore[arg-type]
    base = len(timed) / best[G2P_EN]
    speed = {
        name: {"words_per_s": round(len(timed) / s, 1), "x_g2p_en": round(len(timed) / s / base, 2)}
        for name, s in best.items()
    }
    result: dict[str, Any] = {
        "test_words": len(words),
        "timed_words": len(timed),
        "g2p_en_accuracy": {k: v["overall"] for k, v in accuracy.items()},
        "speed": speed,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
