"""The decoding controls against onmt_translate's on John, on identical weights: an OpenNMT-py 3.5.1
model trained on the Bible split's words (vocabularies small enough to leave words unknown),
imported, and John decoded by both with -block_ngram_repeat, -min_length, -replace_unk and a target
prefix (-tgt_file_prefix, John's first two reference words), at beam 1 and 5. Prints, per case, how
many of John's verses are identical (tests/test_import.py checks the same on a small model in CI).

    python -m benchmarks.importing.onmt_controls_john --data data/grc-en --work runs/onmt-controls \
        [--steps 1500] [--json out.json]

-block_ngram_repeat runs onmt_translate one sentence a batch: OpenNMT-py 3.5.1 keeps its forbidden
n-grams by batch row and does not compact them when finished sentences leave the batch
(docs/decoding.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.alignment.grc_en import ensure_data, read_split
from export.importers import cli
from export.toolkits import toolkits
from service.decode.engine.engine import Engine

MODEL = {  # a bi-GRU with mlp attention, word vocabularies that leave words unknown
    "encoder_type": "brnn",
    "rnn_type": "GRU",
    "global_attention": "mlp",
    "input_feed": 0,
    "bridge": True,
    "hidden_size": 128,
    "word_vec_size": 64,
    "src_vocab_size": 6000,
    "tgt_vocab_size": 3000,
}
CASES: list[tuple[str, list[str], dict[str, Any]]] = [
    ("plain", [], {}),
    ("block_ngram_repeat 2", ["-block_ngram_repeat", "2"], {"no_repeat_ngram_size": 2}),
    ("block_ngram_repeat 3", ["-block_ngram_repeat", "3"], {"no_repeat_ngram_size": 3}),
    ("min_length 12", ["-min_length", "12"], {"min_length": 12}),
    ("replace_unk", ["-replace_unk"], {"replace_unknowns": True}),
    ("target prefix", ["-tgt_file_prefix"], {}),
]


def write_task(data: Path, task: Path) -> None:
    """The Bible split as onmt's train/valid/test .src/.tgt (the Greek lower-cased, as is)."""
    task.mkdir(parents=True, exist_ok=True)
    for ours, theirs in (("train", "train"), ("dev", "valid"), ("test", "test")):
        split = read_split(data, ours)
        (task / f"{theirs}.src").write_text("".join(s + "\n" for s in split.sources), "utf-8")
        (task / f"{theirs}.tgt").write_text("".join(t + "\n" for t in split.targets), "utf-8")


def unk_or_same(ours: str, theirs: str) -> bool:
    """Word for word the same, but where theirs has <unk>."""
    a, b = ours.split(), theirs.split()
    return len(a) == len(b) and all(x == y or y == "<unk>" for x, y in zip(a, b, strict=True))


def run(data: Path, work: Path, steps: int) -> dict[str, Any]:
    ensure_data(data)
    task = work / "task"
    write_task(data, task)
    ckpt = work / "onmt" / f"model_step_{steps}.pt"
    if not ckpt.exists():
        ckpt = toolkits.train_onmt(task, work / "onmt", MODEL, steps=steps)
    bundle = work / "bundle"
    if bundle.exists():
        shutil.rmtree(bundle)
    assert cli.main(["opennmt-py", "--checkpoint", str(ckpt), "--out", str(bundle)]) == 0
    engine = Engine.load(bundle)
    sources = toolkits.read_lines(task / "test.src")
    targets = toolkits.read_lines(task / "test.tgt")
    prefixes = [" ".join(t.split()[:2]) for t in targets]
    prefix_file = work / "prefix.tgt"
    prefix_file.write_text("".join(p + "\n" for p in prefixes), "utf-8")
    rows = []
    for beam in (1, 5):
        for name, flags, controls in CASES:
            extra = [*flags]
            given = None
            if "-tgt_file_prefix" in flags:
                extra = ["-tgt", str(prefix_file), "-tgt_file_prefix"]
                given = prefixes
            batch = 1 if "-block_ngram_repeat" in flags else 32
            out = work / f"{name.replace(' ', '_')}.beam{beam}.txt"
            theirs = toolkits.read_lines(
                toolkits.translate_onmt(ckpt, task / "test.src", out, beam, batch, extra)
            )
            mine = toolkits.translate_lines(engine, sources, beam, given, **controls)
            same = sum(a == b for a, b in zip(mine, theirs, strict=True))
            row = {"case": name, "beam": beam, "identical": same, "verses": len(sources)}
            if name == "replace_unk":
                pairs = list(zip(mine, theirs, strict=True))
                row["identical_after_the_first_word"] = sum(
                    a.split()[1:] == b.split()[1:] for a, b in pairs
                )
                # OpenNMT-py writes its source vocabulary's token, <unk> for an unknown source
                # word; ours the word as sent
                row["identical_but_onmt_unk_for_unknown_source_words"] = sum(
                    unk_or_same(a, b) for a, b in pairs
                )
                row["identical_but_that_and_the_first_word"] = sum(
                    unk_or_same(" ".join(a.split()[1:]), " ".join(b.split()[1:])) for a, b in pairs
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"checkpoint": str(ckpt), "model": MODEL, "steps": steps, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--work", type=Path, default=Path("runs/onmt-controls"))
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    report = run(args.data, args.work, args.steps)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
