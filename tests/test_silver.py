"""Silver links (export/train/teacher.py): eflomal's links where a corpus has no gold.

A toy corpus whose config names a gold alignment file trains through s2s-train with
[alignment] teacher = "eflomal": the gold file is never opened (every file the corpus reader reads
is recorded), eflomal's links are written beside the run's data and guide the attention, the link
head learns from them, and the manifest and ModelInfo say the links are eflomal's. The served head
is scored against the gold it never saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export import pipeline
from export.data import parallel
from export.data.parallel import CorpusConfig, SplitSpec
from export.link_head import agreement_pairs
from export.metrics.aer import parse_pharaoh, score_corpus
from export.train.link_head import Example, make_batch
from export.train.teacher import (
    AlignmentConfig,
    eflomal_gdfa,
    fold,
    recorded_source,
    resolve_teacher,
    silver_links,
    vote,
)
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.engine.engine import Engine
from service.decode.runtime.lexicon import NUM_FEATURES
from service.decode.shared.config import RuntimeConfig
from service.model.bundle import load_bundle
from service.serve.protocol import links_source
from tests.test_parallel_corpus import toy_config

CPU = RuntimeConfig(providers=("CPUExecutionProvider",))


def test_fold_lowercases_and_strips_accents() -> None:
    assert fold("Ἐν ἀρχῇ ἦν ὁ Λόγος") == "εν αρχη ην ο λογος"


def test_auto_teacher_is_gold_where_there_is_gold_else_eflomal_when_links_are_needed() -> None:
    gold = CorpusConfig({"train": SplitSpec("train", Path("a"), Path("b"), Path("c"))})
    text = CorpusConfig({"train": SplitSpec("train", Path("a"), Path("b"))})
    auto = AlignmentConfig()
    assert resolve_teacher(auto, gold, needs_links=True) == "gold"
    assert resolve_teacher(auto, text, needs_links=True) == "eflomal"
    assert resolve_teacher(auto, text, needs_links=False) == "gold"
    assert resolve_teacher(AlignmentConfig(teacher="eflomal"), gold, True) == "eflomal"
    with pytest.raises(ValueError, match="teacher must be one of"):
        AlignmentConfig(teacher="giza")
    with pytest.raises(ValueError, match="unknown keys"):
        AlignmentConfig.from_dict({"techer": "eflomal"})
    with pytest.raises(ValueError, match="min_votes <= runs"):
        AlignmentConfig(runs=2, min_votes=3)
    with pytest.raises(ValueError, match="attach_unaligned must be one of"):
        AlignmentConfig(attach_unaligned="both")


def test_votes_keep_the_links_enough_runs_hold() -> None:
    runs = [[{(0, 0), (1, 1)}, {(0, 0)}], [{(0, 0)}, {(1, 0)}], [{(0, 0), (1, 1)}, set()]]
    assert vote(runs, 1) == [{(0, 0), (1, 1)}, {(0, 0), (1, 0)}]
    assert vote(runs, 2) == [{(0, 0), (1, 1)}, set()]
    assert vote(runs, 3) == [{(0, 0)}, set()]


def test_silver_links_vote_over_runs_then_attach_what_is_left_unaligned() -> None:
    """Three eflomal runs on a language where a target word ("the", t) has no source word: the
    links voted in by 2 of 3 runs, then every target word left over joined to its right
    neighbour's source word, as the config says; the manifest's record says so too."""
    sources = ["a b", "b a", "a", "b"] * 40
    targets = ["t x t y", "t y t x", "t x", "t y"] * 40
    cfg = AlignmentConfig(teacher="eflomal", runs=3, min_votes=2, attach_unaligned="right")
    said: list[str] = []
    links, forward, reverse = silver_links(sources, targets, cfg, said.append)
    assert said == [
        "teacher eflomal: run 1 of 3",
        "teacher eflomal: run 2 of 3",
        "teacher eflomal: run 3 of 3",
    ]
    assert len(links) == len(forward) == len(reverse) == len(sources)
    gold = [
        {(i, 2 * i) for i in range(len(s.split()))}
        | {(i, 2 * i + 1) for i in range(len(s.split()))}
        for s in sources
    ]
    # every target word is linked, and to the source word of the word it precedes
    assert all(
        {j for _, j in x} == set(range(len(t.split()))) for x, t in zip(links, targets, strict=True)
    )
    assert score_corpus(links, gold).aer < 0.1
    record = cfg.eflomal_settings()
    assert (record["runs"], record["min_votes"], record["attach_unaligned"]) == (3, 2, "right")
    # what the manifest records reads back as the same teacher
    # (benchmarks/alignment/grc_en_silver.py)
    assert AlignmentConfig.from_record(record | {"pairs": 160, "seconds": 1.0}) == cfg


def test_eflomal_finds_a_word_for_word_language() -> None:
    """On a one-to-one toy language eflomal's symmetrized links are nearly all right."""
    sources = ["a b c", "b c", "c a", "a c b", "b a"] * 40
    targets = ["x y z", "y z", "z x", "x z y", "y x"] * 40
    links = eflomal_gdfa(sources, targets)
    assert len(links) == len(sources)
    gold = [{(i, i) for i in range(len(s.split()))} for s in sources]
    assert score_corpus(links, gold).aer < 0.1


@pytest.fixture(scope="module")
def silver_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    """The toy corpus (its config names all.pharaoh, the gold) through s2s-train with eflomal as
    the teacher; returns the run, the gold file and every file the corpus reader read."""
    folder = tmp_path_factory.mktemp("silver")
    config = toy_config(folder, steps=120)
    config.write_text(
        config.read_text()
        + '\n[alignment]\nteacher = "eflomal"\n\n[link_head]\nepochs = 6\nhidden = 32\n'
    )
    read: list[Path] = []
    original = parallel.read_lines
    with pytest.MonkeyPatch.context() as mp:

        def spy(path: Path) -> list[str]:
            read.append(Path(path))
            return original(path)

        mp.setattr(parallel, "read_lines", spy)
        assert pipeline.main(["--config", str(config), "--out", str(folder / "run")]) == 0
    return folder / "run", folder / "all.pharaoh", read


@pytest.mark.slow
def test_silver_run_reads_no_gold_link(silver_run: tuple[Path, Path, list[Path]]) -> None:
    run, gold, read = silver_run
    assert read, "the spy saw the corpus being read"
    assert gold.resolve() not in {p.resolve() for p in read}
    assert all(not p.name.endswith(".pharaoh") or ".eflomal." in p.name for p in read)
    # what guided the attention and trained the head: eflomal's links, written beside the data
    for split in ("train", "dev"):
        silver = (run / "data" / f"{split}.eflomal.pharaoh").read_text().splitlines()
        sidecar = [json.loads(x)["words"] for x in (run / "data" / f"{split}.gold.jsonl").open()]
        assert [sorted(map(list, parse_pharaoh(x))) for x in silver] == sidecar
    # the test split keeps no links: silver is not gold to score against
    assert all(not json.loads(x)["words"] for x in (run / "data" / "test.gold.jsonl").open())
    record = json.loads((run / "data" / "eflomal.json").read_text())
    assert record["teacher"] == "eflomal" and record["pairs"] == 440


@pytest.mark.slow
def test_silver_head_is_served_and_says_where_its_links_came_from(
    silver_run: tuple[Path, Path, list[Path]],
) -> None:
    run, gold_file, _ = silver_run
    manifest = json.loads((run / "bundle" / "manifest.json").read_text())
    source = manifest["info"]["link_head"]["links_source"]
    assert source["teacher"] == "eflomal" and source["model"] == 3
    assert "grow-diag-final-and" in source["directions"]
    engine = Engine.load(run / "bundle", CPU)
    assert engine.link_head is not None
    assert links_source(engine.bundle.info) == "eflomal"  # what ModelInfo.links_source says
    # the head, trained on silver only, against the gold it never read (test lines 421-440)
    lines = [(run / "data" / "test.src").read_text().splitlines()]
    targets = (run / "data" / "test.tgt").read_text().splitlines()
    pairs = list(zip(lines[0], targets, strict=True))
    gold = [parse_pharaoh(x) for x in gold_file.read_text().splitlines()[420:440]]
    head = align(engine, pairs, AlignOptions(links="head"))
    aer = score_corpus([parse_pharaoh(r.pharaoh) for r in head], gold).aer
    assert aer < 0.2


def test_gold_heads_say_gold() -> None:
    assert links_source({"link_head": {"dev_aer": 0.2}}) == "gold"
    assert links_source({"link_head": {"links_source": {"teacher": "gold"}}}) == "gold"


def test_agreement_labels_keep_what_both_directions_propose(tmp_path: Path) -> None:
    """Positives: links both eflomal directions give; left out of the loss: the rest of what
    either direction or the symmetrization proposes; everything else stays a negative."""
    (tmp_path / "train.src").write_text("a b c\nd e\n")
    (tmp_path / "train.tgt").write_text("x y z\nu v\n")
    (tmp_path / "train.eflomal.pharaoh").write_text("0-0 1-1 2-1\n0-1\n")
    (tmp_path / "train.eflomal-fwd.pharaoh").write_text("0-0 1-1\n0-1\n")
    (tmp_path / "train.eflomal-rev.pharaoh").write_text("0-0 2-2\n1-0\n")
    spec = SplitSpec(
        "train", tmp_path / "train.src", tmp_path / "train.tgt", tmp_path / "train.eflomal.pharaoh"
    )
    pairs, unlabeled = agreement_pairs(spec, parallel.load_split(spec))
    assert pairs == [("a b c", "x y z", [(0, 0)])]  # the second pair agrees on nothing: left out
    assert unlabeled == [[(1, 1), (2, 1), (2, 2)]]
    example = Example(
        states=np.zeros((3, 4), np.float32),
        src_ids=np.arange(3),
        src_word_of=np.arange(3),
        tgt_ids=np.arange(3),
        tgt_word_of=np.arange(3),
        features=np.zeros((3, 3, NUM_FEATURES), np.float32),
        gold=pairs[0][2],
        src_words=["a", "b", "c"],
        tgt_words=["x", "y", "z"],
        unlabeled=unlabeled[0],
    )
    batch = make_batch([example])  # valid: (B, T_w, S_w), cell [t, s]
    assert batch.gold[0, 0, 0] == 1 and int(batch.gold.sum()) == 1
    assert not batch.valid[0, 1, 1] and not batch.valid[0, 1, 2] and not batch.valid[0, 2, 2]
    assert int(batch.valid.sum()) == 9 - 3


def test_the_shipped_silver_bundle_names_eflomal_and_the_gold_one_gold() -> None:
    root = Path(__file__).resolve().parents[1] / "models"
    silver = load_bundle(root / "grc-en-nt-silver")
    assert silver.has_link_head and links_source(silver.info) == "eflomal"
    assert silver.info["link_head"]["links_source"]["eflomal_version"] == "2.0.0"
    assert links_source(load_bundle(root / "grc-en-nt").info) == "gold"


def test_a_head_trained_apart_reads_the_teachers_record_beside_its_links(tmp_path: Path) -> None:
    """python -m export.link_head over a silver run's files records eflomal, not gold."""
    links = tmp_path / "train.eflomal.pharaoh"
    links.write_text("0-0\n")
    (tmp_path / "eflomal.json").write_text('{"teacher": "eflomal", "sha256": "x", "model": 3}')
    assert recorded_source(links) == {"teacher": "eflomal", "model": 3}
    assert recorded_source(tmp_path / "train.pharaoh")["teacher"] == "gold"
    assert recorded_source(None)["teacher"] == "gold"
