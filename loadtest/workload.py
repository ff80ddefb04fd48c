"""What the load test sends: the sentences, the request kinds and the workload mixes (no locust here).

Sentences come from a `source<TAB>target` TSV, first found of:

1. `$S2S_LOADTEST_SENTENCES`;
2. `docs/eval/test.tsv` (the committed evaluation test split), when it exists;
3. `loadtest/sentences.tsv`, committed: every 4th pair of the default model's test split (seed 1,
   1000 regular + 200 long pairs, as in configs/default.toml), 300 pairs, written by

       python -m loadtest.workload --out loadtest/sentences.tsv     # needs the train extra

4. the same pairs generated on the spot with `export.data.corpus.generate_splits` (~10 s; needs
   num2words and Babel, which a serving-only install lacks, hence the committed copy).

Short and long sentences are the shortest and the longest quarter of the sources by characters.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EVAL_TEST_TSV = REPO / "docs" / "eval" / "test.tsv"
COMMITTED_TSV = Path(__file__).resolve().parent / "sentences.tsv"

# How loadtest/sentences.tsv is made: the default model's corpus (configs/default.toml [data]).
CORPUS_SEED, CORPUS_TRAIN, CORPUS_DEV, CORPUS_TEST, CORPUS_TEST_LONG = 1, 40_000, 500, 1000, 200
SAMPLE_EVERY = 4

LENGTH_FRACTION = 0.25  # short = shortest quarter of the sources, long = longest quarter
BATCH_TEXTS = 16

ENV_SENTENCES = "S2S_LOADTEST_SENTENCES"
ENV_MIX = "S2S_LOADTEST_MIX"
ENV_ALIGNMENT = "S2S_LOADTEST_ALIGNMENT"
ENV_TIMEOUT = "S2S_LOADTEST_TIMEOUT_S"
ENV_WAIT = "S2S_LOADTEST_WAIT_S"
ENV_MODELS = "S2S_LOADTEST_MODELS"  # e.g. "numbers:3,g2p:1": the models requests name, weighted
ENV_TARGET = "S2S_TARGET"
DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 10.0
ALIGNMENTS = ("none", "subword", "word")


@dataclass(frozen=True)
class RequestKind:
    """One kind of Translate call; `name` is what locust's statistics are grouped by."""

    name: str
    pool: str  # "short", "long" or "all": where its texts are drawn from
    texts: int  # texts per request
    beam: int


REQUEST_KINDS: dict[str, RequestKind] = {
    k.name: k
    for k in (
        RequestKind("short-b5", "short", 1, 5),
        RequestKind("long-b5", "long", 1, 5),
        RequestKind(f"batch{BATCH_TEXTS}-b5", "all", BATCH_TEXTS, 5),
        RequestKind("short-b1", "short", 1, 1),
        RequestKind("long-b1", "long", 1, 1),
        RequestKind(f"batch{BATCH_TEXTS}-b1", "all", BATCH_TEXTS, 1),
    )
}

# Workload mixes: request kind -> task weight.
MIXES: dict[str, dict[str, int]] = {
    # everything, mostly single sentences with the server's default beam
    "mixed": {
        "short-b5": 4,
        "long-b5": 2,
        f"batch{BATCH_TEXTS}-b5": 1,
        "short-b1": 2,
        "long-b1": 1,
        f"batch{BATCH_TEXTS}-b1": 1,
    },
    # greedy decoding only
    "beam1": {"short-b1": 2, "long-b1": 1, f"batch{BATCH_TEXTS}-b1": 1},
    # latency isolation: do short requests wait behind long ones? (compare the batching policies)
    "short-long": {"short-b5": 1, "long-b5": 1},
}
DEFAULT_MIX = "mixed"


def texts_per_request(name: str) -> int:
    """Texts sent by one request of the kind called `name` (1 for names this module does not know);
    a model suffix (`kind@model`) is ignored."""
    kind = REQUEST_KINDS.get(name.partition("@")[0])
    return kind.texts if kind else 1


def mix_weights(mix: str) -> dict[str, int]:
    if mix not in MIXES:
        raise ValueError(f"unknown workload mix {mix!r}: use one of {', '.join(MIXES)}")
    return dict(MIXES[mix])


def parse_wait(raw: str) -> tuple[float, float]:
    """'0' -> (0, 0); '0.1,0.5' -> (0.1, 0.5): seconds a user waits between two requests."""
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError as err:
        raise ValueError(f"{ENV_WAIT}: expected SECONDS or MIN,MAX, got {raw!r}") from err
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or not 0 <= values[0] <= values[1] or not math.isfinite(values[1]):
        raise ValueError(
            f"{ENV_WAIT}: expected SECONDS or MIN,MAX with 0 <= MIN <= MAX, got {raw!r}"
        )
    return values[0], values[1]


def parse_models(raw: str) -> tuple[tuple[str, int], ...]:
    """'' -> (("", 1),) (the server's default model); 'a,b' -> a and b equally; 'a:3,b:1' weighted."""
    models: list[tuple[str, int]] = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        name, _, weight = part.partition(":")
        try:
            w = int(weight or "1")
        except ValueError:
            w = 0
        if not name or w < 1:
            raise ValueError(f"{ENV_MODELS}: expected NAME[:WEIGHT],... (weight >= 1), got {raw!r}")
        models.append((name, w))
    return tuple(models) or (("", 1),)


def request_name(kind: str, model: str) -> str:
    """The name locust groups a call under: its kind, and its model when the workload names one."""
    return f"{kind}@{model}" if model else kind


@dataclass(frozen=True)
class LoadTestConfig:
    """The locustfile's settings, from the environment."""

    target: str
    mix: str
    alignment: str
    timeout_s: float
    wait_s: tuple[float, float]
    sentences: str  # the TSV path, or a note that they were generated
    models: tuple[tuple[str, int], ...] = (("", 1),)  # (model name, weight); "" = the default

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoadTestConfig:
        env = os.environ if environ is None else environ
        mix = env.get(ENV_MIX, DEFAULT_MIX) or DEFAULT_MIX
        mix_weights(mix)
        alignment = env.get(ENV_ALIGNMENT, "none") or "none"
        if alignment not in ALIGNMENTS:
            raise ValueError(f"{ENV_ALIGNMENT} must be one of {ALIGNMENTS}, got {alignment!r}")
        timeout_s = float(env.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S)
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"{ENV_TIMEOUT} must be a positive number of seconds")
        return cls(
            target=env.get(ENV_TARGET, DEFAULT_TARGET) or DEFAULT_TARGET,
            mix=mix,
            alignment=alignment,
            timeout_s=timeout_s,
            wait_s=parse_wait(env.get(ENV_WAIT, "0") or "0"),
            sentences=env.get(ENV_SENTENCES, ""),
            models=parse_models(env.get(ENV_MODELS, "")),
        )


# --- sentences ---------------------------------------------------------------------------------


def read_sources(path: str | Path) -> list[str]:
    """The source side of a `source<TAB>target` TSV (a line without a tab is a source alone)."""
    sources = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            source = line.rstrip("\r\n").split("\t", 1)[0].strip()
            if source:
                sources.append(source)
    if not sources:
        raise ValueError(f"{path}: no sentences")
    return sources


def generated_pairs() -> list[tuple[str, str]]:
    """Every SAMPLE_EVERY-th pair of the default model's test split (needs num2words and Babel)."""
    from export.data.corpus import generate_splits  # the train extra

    test = generate_splits(CORPUS_SEED, CORPUS_TRAIN, CORPUS_DEV, CORPUS_TEST, CORPUS_TEST_LONG)[
        "test"
    ]
    return test[::SAMPLE_EVERY]


def load_sources(explicit: str = "") -> tuple[list[str], str]:
    """The sources to send and where they came from (see the module docstring for the order)."""
    if explicit:
        return read_sources(explicit), explicit
    for path in (EVAL_TEST_TSV, COMMITTED_TSV):
        if path.is_file():
            return read_sources(path), str(path)
    try:
        pairs = generated_pairs()
    except ImportError as err:
        raise RuntimeError(
            f"no sentences: set {ENV_SENTENCES} to a TSV, or restore {COMMITTED_TSV} "
            f"(generating them needs the train extra: {err})"
        ) from err
    return [s for s, _ in pairs], "generated by export.data.corpus.generate_splits"


GREEK_SOURCES = Path(__file__).resolve().parent / "grc_sources.txt"  # dev verses (John is not)
G2P_WORDS = (
    "attention", "explorer", "alignment", "knight", "phoneme", "translation", "server", "queue",
    "batch", "decoder", "encoder", "language", "through", "thought", "colonel", "yacht", "receipt",
    "psychology", "rhythm", "island", "wednesday", "february", "library", "necessary", "queueing",
)  # fmt: skip


def model_texts(name: str) -> list[str]:
    """Texts in a served model's domain, by its name: English words for the G2P models, Greek
    verses for the Greek models, the numbers sentences (load_sources) for the others."""
    if name.startswith("g2p"):
        return list(G2P_WORDS)
    if name.startswith("grc-en"):
        return [line for line in GREEK_SOURCES.read_text("utf-8").splitlines() if line.strip()]
    return load_sources()[0]


def split_by_length(
    sources: Sequence[str], fraction: float = LENGTH_FRACTION
) -> tuple[list[str], list[str]]:
    """(shortest `fraction`, longest `fraction`) of the sources by characters; each non-empty."""
    if not sources:
        raise ValueError("no sentences to split")
    ordered = sorted(sources, key=len)
    n = max(1, math.ceil(len(ordered) * fraction))
    return ordered[:n], ordered[-n:]


# --- the committed fallback ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.workload",
        description="Write the load test's fallback sentences: every 4th pair of the default "
        "model's test split (export.data.corpus.generate_splits, seed 1).",
    )
    p.add_argument("--out", type=Path, default=COMMITTED_TSV, help="(default: %(default)s)")
    args = p.parse_args(argv)
    from export.data.corpus import write_tsv

    pairs = generated_pairs()
    write_tsv(args.out, pairs)
    short, long = split_by_length([s for s, _ in pairs])
    print(
        f"{len(pairs)} pairs -> {args.out}; short <= {len(short[-1])} chars, "
        f"long >= {len(long[0])} chars"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
