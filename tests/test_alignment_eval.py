"""Alignment metrics against gold (export/evaluate/alignment_eval.py), the gold sidecar (export/data/gold.py) and
the reversal task (export/data/reversal.py): hand-built matrices with known answers, forced decoding
shapes, and s2s-evaluate --gold end to end on a tiny reversal model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from export.data.gold import GoldLinks, gold_path_for, read_gold, write_gold
from export.data.reversal import DICTIONARY, generate, reversal_gold, write_splits
from export.evaluate.alignment_eval import (
    LinkCounts,
    forced_attention,
    score_links,
    word_argmax,
)
from export.metrics.scoring import EvaluationError
from export.train.data import make_batch
from export.train.model import Seq2Seq
from service.model.architecture import ModelConfig

torch.set_num_threads(1)


def reversal_matrix(n: int, argmax: list[int]) -> np.ndarray:
    """(n, n) one-hot-ish rows: 0.7 on argmax[t], the rest spread evenly."""
    m = np.full((n, n), 0.3 / (n - 1), dtype=np.float32)
    for t, a in enumerate(argmax):
        m[t, a] = 0.7
    return m


def counts_for(matrix: np.ndarray, gold: GoldLinks, src: str, tgt: str) -> dict[str, object]:
    pieces_src = ["\u2581" + w for w in src.split(" ")]
    pieces_tgt = ["\u2581" + w for w in tgt.split(" ")]
    argmax = word_argmax(matrix, pieces_src, pieces_tgt, src, tgt)
    assert argmax is not None
    return score_links(argmax, gold).metrics()


SRC4, TGT4 = "red cat dog sun", "soleil chien chat rouge"


# --- metrics on hand-built matrices ---------------------------------------------------------------


def test_perfect_alignment() -> None:
    m = counts_for(reversal_matrix(4, [3, 2, 1, 0]), reversal_gold(4), SRC4, TGT4)
    assert m["word_accuracy"] == m["word_recall"] == m["phrase_accuracy"] == 100.0
    assert m["aer"] == 0.0
    assert m["off_by_plus_one"] == m["off_by_minus_one"] == m["on_previous_target"] == 0.0


def test_alignment_shifted_by_one() -> None:
    """Each target word after the first looks where the previous one came from (gold + 1 in a
    reversal): 1 hit of 4, 3 off by +1, all 3 on the previous target word; AER = 1 - 2/8."""
    m = counts_for(reversal_matrix(4, [3, 3, 2, 1]), reversal_gold(4), SRC4, TGT4)
    assert m["word_accuracy"] == m["word_recall"] == 25.0
    assert m["aer"] == 75.0
    assert m["off_by_plus_one"] == 75.0 and m["off_by_minus_one"] == 0.0
    assert m["on_previous_target"] == 75.0
    assert m["phrase_accuracy"] == 100.0  # one phrase spanning everything


def test_uniform_attention() -> None:
    """Ties go to the first source word: only target word 3 (gold 0) is hit; target 2 (gold 1) is
    off by -1; targets 0 and 1 (gold 3, 2) are neither."""
    m = counts_for(np.full((4, 4), 0.25, dtype=np.float32), reversal_gold(4), SRC4, TGT4)
    assert m["word_accuracy"] == 25.0 and m["aer"] == 75.0
    assert m["off_by_minus_one"] == 25.0 and m["off_by_plus_one"] == 0.0
    assert m["on_previous_target"] == 0.0


def test_phrases_connectors_and_link_sets() -> None:
    """Two phrases joined by a connector (in no phrase); target word 1 has two gold source words
    (a set: either is right); target word 4 has no word link and is scored at phrase level only."""
    src, tgt = "five hundred and two", "cinq cents et deux x"
    gold = GoldLinks(
        family="mixed",
        parts=2,
        phrases=[(0, 2, 0, 2), (3, 4, 3, 5)],
        words=[(0, 0), (0, 1), (1, 1), (2, 2), (3, 3)],
        families=["cardinal", "cardinal"],
    )
    # argmax per target word: 0 ✓, 0 ✓ (in the set), 3 ✗ (gold 2: off by +1), 3 ✓, 2 (phrase ✗)
    m = counts_for(reversal_matrix(5, [0, 0, 3, 3, 2])[:, :4], gold, src, tgt)
    assert m["phrase_accuracy"] == 75.0  # target words 0, 1, 3 in their phrase; 4 not
    assert m["word_accuracy"] == 75.0  # 3 of the 4 target words with links
    assert m["word_recall"] == 60.0  # 3 of 5 gold links hit
    assert m["aer"] == pytest.approx(100 * (1 - 2 * 3 / (4 + 5)), abs=0.01)
    assert m["off_by_plus_one"] == 25.0


def test_each_target_word_counts_for_its_phrase_family() -> None:
    from export.evaluate.alignment_eval import score_words

    gold = GoldLinks(
        family="mixed",
        parts=2,
        phrases=[(0, 2, 0, 2), (3, 4, 3, 4)],
        words=[(0, 1), (1, 0), (2, 2), (3, 3)],
        families=["date-long", "weekday"],
    )
    words = score_words([0, 0, 2, 0], gold)  # wrong, right, right (connector), wrong
    assert [f for f, _ in words] == ["date-long", "date-long", "connector", "weekday"]
    assert [c.word_hits for _, c in words] == [0, 1, 1, 0]
    assert [c.phrase_hits for _, c in words] == [1, 1, 0, 0]
    one_phrase = GoldLinks("time", 1, [(0, 2, 0, 2)], [(0, 0)])
    assert [f for f, _ in score_words([0, 1], one_phrase)] == ["time", "time"]


def test_subword_rows_are_merged_to_words_first() -> None:
    """Pieces "▁ri" "vière": the target word's rows are averaged and the source word's columns
    summed (service/decode/shared/alignment.py's rule), then the argmax is taken per word."""
    src, tgt = "river stone", "pierre rivière"
    src_pieces, tgt_pieces = (
        ["\u2581river", "\u2581st", "one"],
        ["\u2581pierre", "\u2581ri", "vière"],
    )
    matrix = np.array(  # (3 target pieces, 3 source pieces)
        [[0.2, 0.4, 0.4], [0.6, 0.2, 0.2], [0.3, 0.35, 0.35]], dtype=np.float32
    )
    # word level: "pierre" → stone 0.8; "rivière" → river 0.45 vs stone 0.55 → stone (wrong)
    assert word_argmax(matrix, src_pieces, tgt_pieces, src, tgt) == [1, 1]
    assert word_argmax(matrix, src_pieces, tgt_pieces, "river stone x", tgt) is None


def test_counts_add_up_over_sentences() -> None:
    total = LinkCounts()
    total.add(score_links([3, 2, 1, 0], reversal_gold(4)))
    total.add(score_links([3, 3, 2, 1], reversal_gold(4)))
    m = total.metrics()
    assert m["word_accuracy"] == 62.5 and m["counts"]["sentences"] == 2  # (4 + 1) / 8
    assert LinkCounts().metrics()["word_accuracy"] is None  # nothing scored: no figure


# --- the gold sidecar and the reversal task -----------------------------------------------------


def test_gold_round_trip(tmp_path: Path) -> None:
    items = [
        reversal_gold(3),
        GoldLinks("mixed", 2, [(0, 1, 0, 1), (2, 3, 2, 4)], [(0, 0)], ["time", "date-long"]),
    ]
    path = tmp_path / "test.gold.jsonl"
    write_gold(path, items)
    assert read_gold(path) == items
    assert json.loads(path.read_text().splitlines()[0]) == {
        "family": "reversal",
        "parts": 1,
        "phrases": [[0, 3, 0, 3]],
        "words": [[2, 0], [1, 1], [0, 2]],
    }
    assert gold_path_for(tmp_path / "test.tsv") == path


def test_reversal_gold_is_exact(tmp_path: Path) -> None:
    """Every gold link joins a target word to the source word it translates, position n-1-i."""
    splits = generate(seed=4, n_train=200, n_dev=20, n_test=30, max_len=9)
    write_splits(tmp_path, splits)
    sources = [s for pairs in splits.values() for s, _ in pairs]
    assert len(set(sources)) == len(sources)  # disjoint splits, no repeats
    for name, pairs in splits.items():
        gold = read_gold(tmp_path / f"{name}.gold.jsonl")
        assert len(gold) == len(pairs) == len((tmp_path / f"{name}.tsv").read_text().splitlines())
        for (src, tgt), links in zip(pairs, gold, strict=True):
            s_words, t_words = src.split(" "), tgt.split(" ")
            assert 3 <= len(s_words) <= 9 and len(t_words) == len(s_words)
            assert sorted(t for _, t in links.words) == list(range(len(t_words)))
            for s, t in links.words:
                assert s == len(s_words) - 1 - t and t_words[t] == DICTIONARY[s_words[s]]


# --- forced decoding ----------------------------------------------------------------------------


def tiny_model(style: str = "cgru", attention: str = "additive") -> Seq2Seq:
    torch.manual_seed(0)
    cfg = ModelConfig(
        src_vocab_size=14, tgt_vocab_size=15, emb_dim=8, enc_hidden=6, dec_hidden=12,
        attn_dim=7, decoder_style=style, attention=attention,  # type: ignore[arg-type]
    )  # fmt: skip
    return Seq2Seq(cfg).eval()


@pytest.mark.parametrize("style", ["bahdanau", "luong", "cgru"])
def test_forced_attention_shapes_and_rows(style: str) -> None:
    """One (T_i, S_i) matrix per pair in input order (batched in length order), rows summing to
    1, each equal to the sentence forced through the decoder alone."""
    model = tiny_model(style)
    examples = [([4, 5, 6, 7, 8], [9, 10]), ([4], [5, 6, 7, 8]), ([9, 10, 11], [12])]
    matrices = forced_attention(model, examples, batch_size=2)
    assert [m.shape for m in matrices] == [(2, 5), (4, 1), (1, 3)]
    for (src, tgt), m in zip(examples, matrices, strict=True):
        np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-5)
        alone = make_batch([(src, tgt)])
        with torch.no_grad():
            _, weights = model.teacher_forced(alone.src, alone.lengths, alone.tgt_in)
        np.testing.assert_allclose(m, weights[0, : len(tgt)].numpy(), atol=1e-6)


def test_forced_attention_refuses_a_model_without_attention() -> None:
    with pytest.raises(EvaluationError, match="attention 'none' has no alignment"):
        forced_attention(tiny_model("bahdanau", "none"), [([4], [5])])


# --- s2s-evaluate --gold, end to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def reversal_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny cgru model trained for 30 steps on the reversal task (`[data] task = "reversal"`)."""
    pytest.importorskip("sacrebleu")
    from export.data.tokenizer import SpmOptions
    from export.train.train import DataConfig, OptimConfig, TokenizerConfig, TrainConfig, train

    cfg = TrainConfig(
        model={"emb_dim": 16, "enc_hidden": 16, "dec_hidden": 32, "attn_dim": 16,
               "decoder_style": "cgru"},
        data=DataConfig(task="reversal", reversal_max_len=6, generate_seed=2, n_train=300,
                        n_dev=10, n_test=40, src_vocab=20, tgt_vocab=20),
        optim=OptimConfig(max_steps=30, max_tokens=600, eval_every=15, max_minutes=10, threads=1),
        tokenizer=TokenizerConfig(SpmOptions(model_type="word"), SpmOptions(model_type="word")),
    )  # fmt: skip
    out = tmp_path_factory.mktemp("reversal")
    train(cfg, out, quiet=True)
    return out


def test_evaluate_reports_alignment_against_the_gold_beside_the_test_split(
    reversal_run: Path, tmp_path: Path
) -> None:
    from export.evaluate.evaluate import main

    test = reversal_run / "data" / "test.tsv"
    assert gold_path_for(test).is_file()
    out = tmp_path / "eval"
    args = ["--checkpoint", str(reversal_run / "best.pt"), "--tokenizers", str(reversal_run),
            "--test", str(test), "--out", str(out), "--no-heatmap", "--label", "cgru"]  # fmt: skip
    assert main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    alignment = metrics["alignment"]
    counts = alignment["counts"]
    assert counts["sentences"] == 40 and alignment["skipped"] == 0
    assert counts["gold_links"] == counts["scored_words"] == counts["phrase_words"]
    assert counts["gold_links"] == sum(len(s.split(" ")) for s, _ in read_tsv_pairs(test))
    assert 0.0 <= alignment["word_accuracy"] <= 100.0
    assert alignment["aer"] == pytest.approx(100.0 - alignment["word_accuracy"], abs=0.02)
    assert set(alignment["by_family"]) == {"reversal"}
    markdown = (out / "buckets.md").read_text()
    assert "## Alignments against gold: cgru" in markdown and "| reversal | 40 |" in markdown
    assert main([*args, "--no-gold"]) == 0
    assert "alignment" not in json.loads((out / "metrics.json").read_text())


def test_evaluate_gold_errors_are_clear(
    reversal_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from export.evaluate.evaluate import main

    test = reversal_run / "data" / "test.tsv"
    base = ["--checkpoint", str(reversal_run / "best.pt"), "--tokenizers", str(reversal_run),
            "--test", str(test), "--out", str(tmp_path / "e"), "--no-heatmap"]  # fmt: skip
    assert main([*base, "--gold", str(tmp_path / "nope.jsonl")]) == 1
    assert "gold alignment file not found" in capsys.readouterr().err
    short = tmp_path / "short.gold.jsonl"
    write_gold(short, read_gold(gold_path_for(test))[:5])
    assert main([*base, "--gold", str(short)]) == 1
    assert "the gold file has 5 lines but the test split 40 pairs" in capsys.readouterr().err
    wrong = tmp_path / "wrong.gold.jsonl"
    write_gold(wrong, [reversal_gold(20)] * 40)
    assert main([*base, "--gold", str(wrong)]) == 1
    assert "gold line 1" in capsys.readouterr().err


def read_tsv_pairs(path: Path) -> list[tuple[str, str]]:
    from export.data.corpus import read_tsv

    return read_tsv(path)


# --- guided alignment ---------------------------------------------------------------------------


def test_piece_guide_spreads_each_gold_word_over_its_pieces() -> None:
    from export.train.guided import piece_guide

    gold = GoldLinks("reversal", 1, [(0, 2, 0, 2)], [(1, 0), (0, 1)])
    guide = piece_guide(
        gold, ["\u2581river", "\u2581st", "one"], ["\u2581pierre", "\u2581ri", "vière"]
    )
    assert guide is not None
    expected = np.array([[0, 0.5, 0.5], [1, 0, 0], [1, 0, 0]], dtype=np.float32)
    np.testing.assert_allclose(guide, expected)
    unlinked = GoldLinks("x", 1, [], [(1, 0)])  # target word 1 has no link: its rows stay 0
    assert piece_guide(unlinked, ["\u2581a", "\u2581b"], ["\u2581c", "\u2581d"]).tolist() == [  # type: ignore[union-attr]
        [0.0, 1.0],
        [0.0, 0.0],
    ]
    assert piece_guide(gold, ["\u2581riverstone"], ["\u2581pierre", "\u2581ri"]) is None


def test_guided_loss() -> None:
    """Cross-entropy of attention rows against the guide, over guided rows only."""
    from export.train.guided import guided_loss

    guide = torch.zeros(1, 3, 4)
    guide[0, 0, 2] = 1.0
    guide[0, 1, 0] = 1.0  # row 2 is unguided (EOS, or a word without gold)
    uniform = torch.full((1, 3, 4), 0.25)
    assert float(guided_loss(uniform, guide)) == pytest.approx(np.log(4), abs=1e-4)
    assert float(guided_loss(guide + 0.0, guide)) == pytest.approx(0.0, abs=1e-4)
    assert float(guided_loss(uniform, torch.zeros(1, 3, 4))) == 0.0


def test_batches_carry_guides_with_their_examples() -> None:
    import random

    from export.train.data import batches

    examples = [([4] * n, [5] * n) for n in (3, 5, 2, 4)]
    guides = [np.eye(n, dtype=np.float32)[::-1] for n in (3, 5, 2, 4)]  # reversal, piece = word
    seen = 0
    for batch in batches(examples, max_tokens=12, rng=random.Random(0), guides=guides):
        assert batch.guide is not None
        assert batch.guide.shape == (*batch.tgt_in.shape, batch.src.shape[1])
        for row in range(batch.guide.shape[0]):
            n = int(batch.lengths[row])
            np.testing.assert_array_equal(batch.guide[row, :n, :n].numpy(), np.eye(n)[::-1])
            assert float(batch.guide[row].sum()) == n  # EOS step and padding unguided
            seen += 1
    assert seen == 4


def test_training_with_guided_alignment(tmp_path: Path) -> None:
    """[optim] guided_alignment trains from the split's gold; without gold it says what is missing."""
    pytest.importorskip("sacrebleu")
    from export.data.tokenizer import SpmOptions
    from export.train.train import DataConfig, OptimConfig, TokenizerConfig, TrainConfig, train

    def config(**data: object) -> TrainConfig:
        return TrainConfig(
            model={"emb_dim": 8, "enc_hidden": 8, "dec_hidden": 16, "attn_dim": 8},
            data=DataConfig(**{"n_train": 100, "n_dev": 5, "n_test": 5, "src_vocab": 20,  # type: ignore[arg-type]
                               "tgt_vocab": 20, "generate_seed": 3, **data}),
            optim=OptimConfig(max_steps=4, max_tokens=300, eval_every=4, threads=1,
                              guided_alignment=1.0),
            tokenizer=TokenizerConfig(SpmOptions(model_type="word"), SpmOptions(model_type="word")),
        )  # fmt: skip

    summary = train(config(task="reversal", reversal_max_len=5), tmp_path / "guided", quiet=True)
    assert summary["steps"] == 4
    splits = generate(seed=3, n_train=100, n_dev=5, n_test=5, max_len=5)
    write_splits(tmp_path / "tsv", splits)
    (tmp_path / "tsv" / "train.gold.jsonl").unlink()
    files = {name: str(tmp_path / "tsv" / f"{name}.tsv") for name in ("train", "dev", "test")}
    with pytest.raises(
        ValueError, match=r"needs the training split's gold links: no .*train\.gold\.jsonl"
    ):
        train(config(generate_seed=None, **files), tmp_path / "missing", quiet=True)


@pytest.mark.parametrize(
    "name", ["bahdanau", "luong", "cgru", "bahdanau-guided", "luong-guided", "cgru-guided"]
)
def test_reversal_configs_load(name: str) -> None:
    """The committed reversal configs parse, name the reversal task and differ from the base config
    of their style only where their name says."""
    from export.train.train import TrainConfig

    repo = Path(__file__).resolve().parent.parent
    cfg = TrainConfig.load(repo / "configs" / f"reversal-{name}.toml")
    style = name.removesuffix("-guided")
    assert cfg.data.task == "reversal" and cfg.model["decoder_style"] == style
    assert (cfg.optim.guided_alignment > 0) == name.endswith("-guided")
    base = TrainConfig.load(repo / "configs" / "reversal-cgru.toml")
    assert {k: v for k, v in cfg.model.items() if k != "decoder_style"} == {
        k: v for k, v in base.model.items() if k != "decoder_style"
    }
    assert cfg.data == base.data
