"""End to end: train() on a tiny generated corpus, then export/evaluate/evaluate.py's CLI on its output.

Also unit tests of evaluate's pure parts (buckets, scores, markdown) and greedy_with_attention.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("num2words")
pytest.importorskip("babel")
pytest.importorskip("sacrebleu")
pytest.importorskip("matplotlib")

from export.data import corpus
from export.evaluate.evaluate import main
from export.evaluate.report import buckets_markdown, compare_markdown
from export.metrics.scoring import (
    Bucket,
    bucket_index,
    bucket_scores,
    compute_metrics,
    make_buckets,
    score,
)
from export.train.checkpoint import load_checkpoint, save_checkpoint
from export.train.greedy import greedy_with_attention
from export.train.model import Seq2Seq
from export.train.train import (
    DataConfig,
    OptimConfig,
    TrainConfig,
    budget_spent,
    describe_end,
    train,
)
from service.model.architecture import ModelConfig
from service.model.tokenizer import Tokenizer

torch.set_num_threads(1)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_MODEL: dict[str, Any] = {
    "emb_dim": 16,
    "enc_hidden": 16,
    "dec_hidden": 32,
    "attn_dim": 16,
    "dropout": 0.0,
}


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny training run (~3 s): 150 generated pairs, 12 steps, a dev evaluation every 5 steps."""
    cfg = TrainConfig(
        model=TINY_MODEL,
        data=DataConfig(
            generate_seed=3,
            n_train=150,
            n_dev=15,
            n_test=15,
            n_test_long=5,
            src_vocab=100,
            tgt_vocab=120,
        ),
        optim=OptimConfig(
            max_steps=12, max_epochs=5, max_tokens=800, eval_every=5, max_minutes=10, threads=1
        ),
    )
    out = tmp_path_factory.mktemp("run")
    summary = train(cfg, out, quiet=True)
    assert summary["checkpoint"] == str(out / "best.pt") and summary["steps"] == 12
    return out


@pytest.fixture(scope="module")
def eval_dir(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """evaluate's CLI on the run, with --train and the heatmap of test sentence 3."""
    out = tmp_path_factory.mktemp("eval") / "default"
    code = main(
        [
            "--checkpoint", str(run_dir / "best.pt"),
            "--tokenizers", str(run_dir),
            "--test", str(run_dir / "data" / "test.tsv"),
            "--train", str(run_dir / "data" / "train.tsv"),
            "--out", str(out),
            "--heatmap-index", "3",
        ]
    )  # fmt: skip
    assert code == 0
    return out


# --- train() -------------------------------------------------------------------------------------


def test_train_writes_its_outputs(run_dir: Path) -> None:
    for name in ("best.pt", "source.model", "target.model", "train_log.jsonl", "summary.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["parameters"] > 0
    *log, end = [
        json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()
    ]
    assert [entry["step"] for entry in log] == [5, 10, 12]  # every 5 steps, then at max_steps
    assert all({"step", "dev_bleu", "lr", "minutes"} <= entry.keys() for entry in log)
    assert summary["best_dev_bleu"] == max(entry["dev_bleu"] for entry in log)
    assert end["step"] == 12 and end["ended_by"] == summary["ended_by"] == "max_steps"
    _, meta = load_checkpoint(run_dir / "best.pt")
    assert meta["ended_by"] == "max_steps" and meta["last_step"] == 12


def test_a_run_cut_short_by_max_minutes_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TrainConfig(
        model=TINY_MODEL,
        data=DataConfig(
            generate_seed=3,
            n_train=60,
            n_dev=5,
            n_test=5,
            n_test_long=2,
            src_vocab=80,
            tgt_vocab=90,
        ),
        optim=OptimConfig(max_steps=1000, max_tokens=800, max_minutes=0.0, threads=1),
    )
    summary = train(cfg, tmp_path)
    assert summary["steps"] == 1 and summary["ended_by"] == "max_minutes"
    end = json.loads((tmp_path / "train_log.jsonl").read_text().splitlines()[-1])
    assert end == {"step": 1, "ended_by": "max_minutes", "minutes": end["minutes"]}
    assert load_checkpoint(tmp_path / "best.pt")[1]["ended_by"] == "max_minutes"
    printed = capsys.readouterr().out
    assert "ran out before max_steps (1000)" in printed and "--max-minutes" in printed


def test_budget_spent_names_the_limit() -> None:
    o = OptimConfig(max_steps=10, max_minutes=5.0)
    assert budget_spent(o, 3, 1.0) is None
    assert budget_spent(o, 10, 1.0) == "max_steps"
    assert budget_spent(o, 3, 5.0) == "max_minutes"
    assert budget_spent(o, 10, 9.0) == "max_steps"  # a tie goes to the reproducible budget
    assert budget_spent(OptimConfig(max_steps=0, max_minutes=5.0), 10, 1.0) is None
    assert "raise --max-minutes" not in describe_end(o, "max_steps", 10, 1.0)
    assert "optim.patience" in describe_end(o, "patience", 4, 1.0)


def test_train_checkpoint_loads_with_its_tokenizers(run_dir: Path) -> None:
    model, extra = load_checkpoint(run_dir / "best.pt")
    assert model.cfg.attention == "additive" and model.cfg.enc_hidden == 16
    assert model.cfg.src_vocab_size == Tokenizer.load(run_dir / "source.model").vocab_size
    assert model.cfg.tgt_vocab_size == Tokenizer.load(run_dir / "target.model").vocab_size
    assert extra["train_config"]["data"]["n_train"] == 150


def test_train_splits_are_disjoint(run_dir: Path) -> None:
    splits = {
        name: corpus.read_tsv(run_dir / "data" / f"{name}.tsv") for name in ("train", "dev", "test")
    }
    assert [len(splits[n]) for n in ("train", "dev", "test")] == [150, 15, 20]
    sources = {name: {s for s, _ in pairs} for name, pairs in splits.items()}
    assert not sources["train"] & sources["dev"]
    assert not sources["train"] & sources["test"]
    assert not sources["dev"] & sources["test"]


# --- evaluate's CLI ------------------------------------------------------------------------------


def test_evaluate_writes_reports(eval_dir: Path, run_dir: Path) -> None:
    for name in ("metrics.json", "buckets.md"):
        assert (eval_dir / name).is_file(), name
    assert is_png(eval_dir / "bleu_by_length.png")
    assert is_png(eval_dir / "attention_heatmap.png")
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    test = corpus.read_tsv(run_dir / "data" / "test.tsv")
    assert metrics["overall"]["n"] == len(test) == sum(b["n"] for b in metrics["buckets"])
    assert [b["label"] for b in metrics["buckets"]] == [
        "1-10",
        "11-20",
        "21-30",
        "31-40",
        "41-50",
        "51+",
    ]
    for key in ("bleu", "chrf", "exact_match"):
        assert 0.0 <= metrics["overall"][key] <= 100.0
    src_tok = Tokenizer.load(run_dir / "source.model")
    train_pairs = corpus.read_tsv(run_dir / "data" / "train.tsv")
    assert metrics["max_train_source_len"] == max(len(src_tok.encode(s)) for s, _ in train_pairs)
    assert metrics["heatmap"]["source"] == test[3][0]
    assert "| 1-10 |" in (eval_dir / "buckets.md").read_text()


def test_evaluate_heatmap_for_given_text(run_dir: Path, tmp_path: Path) -> None:
    code = main(
        [
            "--checkpoint", str(run_dir / "best.pt"),
            "--tokenizers", str(run_dir),
            "--test", str(run_dir / "data" / "dev.tsv"),
            "--out", str(tmp_path),
            "--heatmap-text", "ninety-seven and March 5, 2021",
        ]
    )  # fmt: skip
    assert code == 0
    assert is_png(tmp_path / "attention_heatmap.png")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["heatmap"]["source"] == "ninety-seven and March 5, 2021"
    assert metrics["max_train_source_len"] is None  # no --train given
    assert "beyond train" not in (tmp_path / "buckets.md").read_text()


@pytest.fixture(scope="module")
def none_eval_dir(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """evaluate on an untrained attention-'none' model that uses the run's tokenizers."""
    trained = load_checkpoint(run_dir / "best.pt")[0].cfg
    torch.manual_seed(0)
    cfg = ModelConfig(
        trained.src_vocab_size, trained.tgt_vocab_size, attention="none", **TINY_MODEL
    )  # type: ignore[arg-type]
    tmp = tmp_path_factory.mktemp("none")
    save_checkpoint(tmp / "none.pt", Seq2Seq(cfg))
    args = [
        "--checkpoint",
        str(tmp / "none.pt"),
        "--tokenizers",
        str(run_dir),
        "--test",
        str(run_dir / "data" / "test.tsv"),
    ]
    assert (
        main([*args, "--out", str(tmp / "eval"), "--train", str(run_dir / "data" / "train.tsv")])
        == 0
    )
    return tmp / "eval"


def test_evaluate_skips_heatmap_for_attention_none(none_eval_dir: Path) -> None:
    assert (none_eval_dir / "metrics.json").is_file()
    assert is_png(none_eval_dir / "bleu_by_length.png")
    assert not (none_eval_dir / "attention_heatmap.png").exists()
    assert "heatmap" not in json.loads((none_eval_dir / "metrics.json").read_text())


def test_compare_writes_table_and_plot(eval_dir: Path, none_eval_dir: Path, tmp_path: Path) -> None:
    runs = [str(eval_dir), str(none_eval_dir / "metrics.json")]  # a folder or the file itself
    assert (
        main(["compare", "--runs", *runs, "--labels", "attention", "none", "--out", str(tmp_path)])
        == 0
    )
    table = (tmp_path / "compare.md").read_text()
    assert "| source tokens | attention | none |" in table
    assert "| **all** |" in table
    assert is_png(tmp_path / "bleu_by_length.png")


def test_cli_errors_are_clear(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "--tokenizers",
        str(run_dir),
        "--test",
        str(run_dir / "data" / "test.tsv"),
        "--out",
        str(tmp_path),
    ]
    assert main(["--checkpoint", str(tmp_path / "missing.pt"), *base]) == 1
    assert "checkpoint not found" in capsys.readouterr().err
    assert main(["--checkpoint", str(run_dir / "best.pt"), *base, "--heatmap-index", "999"]) == 1
    assert "--heatmap-index 999 is outside the test split" in capsys.readouterr().err
    assert main(["compare", "--runs", str(tmp_path), "--out", str(tmp_path)]) == 1
    assert "cannot read metrics" in capsys.readouterr().err
    assert (
        main(["compare", "--runs", str(run_dir), "--labels", "a", "b", "--out", str(tmp_path)]) == 1
    )
    assert "give one label per run" in capsys.readouterr().err


# --- evaluate's pure parts -----------------------------------------------------------------------


def test_buckets() -> None:
    buckets = make_buckets((10, 20))
    assert buckets == [Bucket(1, 10), Bucket(11, 20), Bucket(21, None)]
    assert [b.label for b in buckets] == ["1-10", "11-20", "21+"]
    assert [bucket_index(n, buckets) for n in (0, 1, 10, 11, 20, 21, 500)] == [0, 0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="increasing"):
        make_buckets((20, 10))


def test_scores_and_bucket_scores() -> None:
    refs = ["un deux trois quatre", "cinq six sept huit", "neuf dix onze douze"]
    hyps = ["un deux trois quatre", "cinq six sept huit", "neuf"]
    perfect = score(refs, refs)
    assert perfect == {"n": 3, "bleu": 100.0, "chrf": 100.0, "exact_match": 100.0}
    assert score([], [])["bleu"] is None
    rows = bucket_scores([3, 12, 25], hyps, refs, make_buckets((10, 20)), max_train_len=20)
    assert [(r["n"], r["exact_match"]) for r in rows] == [(1, 100.0), (1, 100.0), (1, 0.0)]
    assert [r["beyond_train"] for r in rows] == ["none", "none", "all"]
    rows = bucket_scores([3, 12, 25], hyps, refs, make_buckets((10, 30)), max_train_len=20)
    assert rows[1]["beyond_train"] == "some" and rows[1]["n_beyond_train"] == 1
    assert rows[2]["n"] == 0 and rows[2]["bleu"] is None


def test_markdown_tables() -> None:
    refs = ["a b c d", "e f g h"]
    metrics: dict[str, Any] = compute_metrics(
        [5, 15], refs, refs, make_buckets((10,)), max_train_len=10
    )
    table = buckets_markdown(metrics, "demo")
    assert "| 1-10 | 1 | 100.00 | 100.00 | 100.00 |  |" in table
    assert "| 11+ | 1 | 100.00 | 100.00 | 100.00 | all |" in table
    assert "Longest training source: 10 tokens." in table
    other = compute_metrics([5, 15], ["a b c d", "x"], refs, make_buckets((10,)), max_train_len=10)
    table = compare_markdown([("attention", metrics), ("none", other)])
    assert "| 11+ † | 100.00 (1) | 0.00 (1) |" in table


@pytest.mark.parametrize("attention", ["additive", "general", "none"])
def test_greedy_with_attention_matches_greedy(attention: str) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=14, tgt_vocab_size=14, attention=attention, **TINY_MODEL)  # type: ignore[arg-type]
    model = Seq2Seq(cfg).eval()
    src = [4, 5, 6, 7, 8]
    ids, weights = greedy_with_attention(model, src, max_len=9)
    assert weights.shape == (len(ids), len(src))
    expected = model.greedy(torch.tensor([src]), torch.tensor([len(src)]), 9)[0]
    assert [i for i in ids if i != cfg.eos_id] == expected
    if attention == "none":
        assert np.all(weights == 0)
    else:
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
