"""The training data knobs: [data] part_weights / family_weights / lowercase_source, [tokenizer.*]
split_digits, and the lower-case rule reaching the exported bundle. No training here."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("num2words")
pytest.importorskip("sentencepiece")

from export.data.corpus import read_tsv, write_tsv
from export.data.gold import read_gold
from export.data.tokenizer import SpmOptions, train_sentencepiece
from export.onnx.to_onnx import export_bundle
from export.train.checkpoint import save_checkpoint
from export.train.train import DataConfig, TrainConfig, prepare_corpus
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.model.tokenizer import Tokenizer
from tests.conftest import REPO, TinyModel


def test_default_config_declares_the_new_data_pipeline() -> None:
    cfg = TrainConfig.load(REPO / "configs" / "default.toml")
    assert cfg.data.lowercase_source
    assert cfg.data.part_weights == (6.0, 3.0, 1.0)  # 1-3 phrases: the server segments longer ones
    assert cfg.tokenizer.source.split_digits and cfg.tokenizer.target.split_digits
    assert cfg.model["decoder_style"] == "cgru" and cfg.optim.guided_alignment > 0


def test_bad_data_knobs_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[data]\nfamily_weights = {"cardinals" = 1}\n')
    with pytest.raises(ValueError, match="unknown value families"):
        TrainConfig.load(config)
    with pytest.raises(ValueError, match="part_weights"):
        DataConfig(part_weights=(0, 0))


def test_generated_corpus_is_lowercased_and_written_with_its_gold(tmp_path: Path) -> None:
    cfg = DataConfig(
        generate_seed=3,
        n_train=200,
        n_dev=10,
        n_test=10,
        n_test_long=2,
        part_weights=(1, 1),
        lowercase_source=True,
    )
    splits = prepare_corpus(cfg, tmp_path)
    sources = [s for s, _ in splits["train"]]
    assert all(s == s.lower() for s in sources)
    assert any(t != t.lower() for _, t in splits["train"])  # the target keeps its case ("$US")
    for name, pairs in splits.items():
        assert read_tsv(tmp_path / "data" / f"{name}.tsv") == pairs
        gold = read_gold(tmp_path / "data" / f"{name}.gold.jsonl")
        assert len(gold) == len(pairs)
        assert all(g.parts <= 2 for g in gold[: len(pairs) - 2])


def test_tsv_corpus_is_lowercased_too(tmp_path: Path) -> None:
    write_tsv(tmp_path / "train.tsv", [("March 5, 2021", "5 mars 2021"), ("10:45 PM", "22:45")])
    cfg = DataConfig(train=str(tmp_path / "train.tsv"), lowercase_source=True)
    assert prepare_corpus(cfg, tmp_path / "run")["train"] == [
        ("march 5, 2021", "5 mars 2021"),
        ("10:45 pm", "22:45"),
    ]


def test_split_digits_makes_every_digit_one_piece(tmp_path: Path) -> None:
    lines = [f"{n:,} and {n * 7}" for n in range(100, 3000, 7)]
    path = train_sentencepiece(
        lines, tmp_path / "s.model", 60, options=SpmOptions(split_digits=True)
    )
    pieces = Tokenizer.load(path).processor.EncodeAsPieces("1000000 and 123456")
    digits = [p.lstrip("▁") for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("1000000123456")


def test_lowercase_source_run_exports_a_lowercasing_bundle(tiny: TinyModel, tmp_path: Path) -> None:
    checkpoint = tmp_path / "lower.pt"
    save_checkpoint(checkpoint, tiny.model, {"train_config": {"data": {"lowercase_source": True}}})
    bundle = export_bundle(checkpoint, tiny.checkpoint.parent, tmp_path / "b", "lower", "0.0.1")
    manifest = (bundle / "manifest.json").read_text()
    assert '"lowercase": true' in manifest
    engine = Engine.load(
        bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )
    answers = engine.translate(["10:45 pm", "10:45 PM", "10:45 Pm"], SearchOptions(beam_size=3))
    texts = [a.hypotheses[0].text for a in answers]
    assert texts[0] == texts[1] == texts[2]
    # a run that did not lower-case keeps the old bundle: no input rule
    assert '"input"' not in (tiny.bundle / "manifest.json").read_text()


def test_without_the_rule_case_changes_the_answer(tiny: TinyModel) -> None:
    """The check above could not fail if case never mattered: on the rule-less bundle it does."""
    engine = Engine.load(
        tiny.bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )
    answers = engine.translate(["10:45 pm", "10:45 PM"], SearchOptions(beam_size=3))
    assert answers[0].hypotheses[0].text != answers[1].hypotheses[0].text
