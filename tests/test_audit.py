"""The audit set (export/data/audit_set.py, `python -m export.data.audit_set`) and its tables
(benchmarks/quality/audit.py) on the tiny bundle."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("num2words")
pytest.importorskip("sacrebleu")

import itertools

from benchmarks.quality import audit as audit_bench
from export.data.audit_set import (
    PARTS_BUCKETS,
    bucket_label,
    find_bucket,
    generate_audit,
    length_buckets,
)
from export.data.audit_set import main as audit_main
from export.data.corpus import read_tsv
from export.data.families import FAMILIES
from export.data.gold import read_gold
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from tests.conftest import TinyModel


def _words(text: str) -> int:
    return len(text.split(" "))


def test_length_buckets_cover_one_to_the_limit() -> None:
    buckets = length_buckets(256)
    assert buckets[0] == (1, 8) and buckets[-1] == (225, 256)
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(buckets))
    assert length_buckets(20) == [(1, 8), (9, 16), (17, 20)]
    assert find_bucket(0, buckets) is None and find_bucket(257, buckets) is None
    assert [bucket_label(b) for b in PARTS_BUCKETS][:3] == ["1", "2", "3-4"]
    assert bucket_label(PARTS_BUCKETS[-1]) == "25+"


def test_audit_set_fills_every_family_and_length_bucket() -> None:
    exclude = {"five", "March 5, 2021"}
    examples = generate_audit(9, 5, 4, _words, 60, exclude=exclude)
    singles = Counter(e.gold.family for e in examples[: 5 * len(FAMILIES)])
    assert singles == dict.fromkeys(FAMILIES, 5)
    assert all(e.gold.parts == 1 for e in examples[: 5 * len(FAMILIES)])
    lengths = Counter(
        find_bucket(_words(e.source), length_buckets(60)) for e in examples[5 * len(FAMILIES) :]
    )
    assert lengths == dict.fromkeys(length_buckets(60), 4)
    sources = [e.source.lower() for e in examples]
    assert len(set(sources)) == len(sources)
    assert not {s.lower() for s in exclude} & set(sources)
    assert max(e.gold.parts for e in examples) >= 5


def test_audit_tables_through_the_engine(tiny: TinyModel, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    argv = ["--bundle", str(tiny.bundle), "--out", str(out), "--seed", "4"]
    assert audit_main([*argv, "--per-family", "2", "--per-bucket", "2", "--token-limit", "24"]) == 0
    pairs, gold = read_tsv(out / "audit.tsv"), read_gold(out / "audit.gold.jsonl")
    assert len(pairs) == len(gold) == 2 * len(FAMILIES) + 2 * len(length_buckets(24))
    engine = Engine.load(
        tiny.bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )
    report = audit_bench.audit(engine, pairs, gold, beam=2, batch_size=16, limit=24)
    assert report["overall"]["n"] == len(pairs) and report["refused"] == 0
    assert {r["group"] for r in report["families"]} == set(FAMILIES)
    assert sum(r["n"] for r in report["parts"]) == len(pairs)
    assert sum(r["n"] for r in report["lengths"]) == len(pairs)
    assert [r["group"] for r in report["lengths"]] == [bucket_label(b) for b in length_buckets(24)]
    singles = sum(1 for g in gold if g.parts == 1)
    assert [r["n"] for r in report["case"]] == [singles] * 3
    text = audit_bench.markdown({"bundle": "tiny", "audit": "a", "beam": 2, **report})
    assert "| family | n | exact match % | BLEU | chrF |" in text
    json.dumps(report)  # JSON-ready


def test_audit_score_counts_right_answers_of_short_phrases() -> None:
    # plain corpus BLEU is 0 for references under 4 words; the audit's is not
    got = audit_bench.score(["5 mars 2021", "15:05"], ["5 mars 2021", "15:06"])
    assert got["exact_match"] == 50.0 and got["bleu"] > 0


def test_audit_cli_writes_json_and_markdown(tiny: TinyModel, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    argv = ["--bundle", str(tiny.bundle), "--out", str(out), "--seed", "5"]
    assert audit_main([*argv, "--per-family", "1", "--per-bucket", "1", "--token-limit", "16"]) == 0
    json_path, md_path = tmp_path / "a.json", tmp_path / "a.md"
    argv = ["--bundle", str(tiny.bundle), "--audit", str(out / "audit.tsv"), "--beam", "2"]
    assert audit_bench.main([*argv, "--json", str(json_path), "--markdown", str(md_path)]) == 0
    report = json.loads(json_path.read_text())
    assert report["overall"]["n"] == len(FAMILIES) + len(length_buckets(16))
    assert "By value family" in md_path.read_text()
    (out / "audit.gold.jsonl").write_text("")  # a sidecar that does not match its TSV
    assert audit_bench.main(argv) == 2
