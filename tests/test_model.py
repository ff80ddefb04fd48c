"""Tests for export/train/model.py (every variant, padding invariance, learning), export/train/checkpoint.py and
ModelConfig validation. Tiny models on CPU."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from export.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from export.train.data import make_batch
from export.train.model import Seq2Seq
from service.model.architecture import ATTENTION_KINDS, DECODER_STYLES, RNN_KINDS, ModelConfig

torch.set_num_threads(1)

VOCAB = 14  # 4 special ids + 10 symbols
VARIANTS = list(itertools.product(RNN_KINDS, ATTENTION_KINDS, DECODER_STYLES))


def make_cfg(
    rnn: str = "gru", attention: str = "additive", style: str = "bahdanau", **kw: object
) -> ModelConfig:
    """A tiny config: emb 16, encoder 8 per direction, decoder 16 (= 2 * 8, so dot is valid)."""
    sizes: dict[str, object] = {
        "emb_dim": 16,
        "enc_hidden": 8,
        "dec_hidden": 16,
        "attn_dim": 8,
        "dropout": 0.0,
    }
    return ModelConfig(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        rnn=rnn,  # type: ignore[arg-type]
        attention=attention,  # type: ignore[arg-type]
        decoder_style=style,  # type: ignore[arg-type]
        **{**sizes, **kw},  # type: ignore[arg-type]
    )


def make_model(cfg: ModelConfig, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(cfg).eval()


# A long and a short sentence: the short one is padded inside the batch.
LONG = ([4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 4, 5])
SHORT = ([9, 10, 11], [12, 13, 4, 5])


# --- every variant ---------------------------------------------------------------------------


@pytest.mark.parametrize(("rnn", "attention", "style"), VARIANTS)
def test_forward_and_decode_step_shapes(rnn: str, attention: str, style: str) -> None:
    cfg = make_cfg(rnn, attention, style)
    model = make_model(cfg)
    batch = make_batch([LONG, SHORT])  # src (2, 7), tgt_in (2, 6)
    logits = model(batch.src, batch.lengths, batch.tgt_in)
    assert logits.shape == (2, 6, VOCAB)
    enc = model.encode(batch.src, batch.lengths)
    assert enc.values.shape == (2, 7, 16) and enc.mask.shape == (2, 7)
    assert enc.state.shape == (2, cfg.state_dim)
    K = 3  # hypotheses per sentence, rows sentence-major
    tokens = torch.full((2 * K,), cfg.bos_id, dtype=torch.long)
    state = enc.state.repeat_interleave(K, dim=0)  # (6, state_dim)
    step_logits, new_state, weights = model.decode_step(
        tokens, state, enc.keys, enc.values, enc.mask
    )
    assert step_logits.shape == (6, VOCAB)
    assert new_state.shape == (6, cfg.state_dim)
    assert weights.shape == (6, 7)
    if attention == "none":
        assert torch.all(weights == 0)
    else:
        torch.testing.assert_close(weights.sum(-1), torch.ones(6))
        assert torch.all(weights[K:, 3:] == 0)  # the short sentence's padding
    outputs = model.greedy(batch.src, batch.lengths, max_len=5)
    assert len(outputs) == 2 and all(len(o) <= 5 for o in outputs)


@pytest.mark.parametrize(("rnn", "attention", "style"), [*VARIANTS, ("gru", "additive", "luong")])
def test_sentence_alone_equals_sentence_in_padded_batch(
    rnn: str, attention: str, style: str
) -> None:
    model = make_model(make_cfg(rnn, attention, style))
    batch = make_batch([LONG, SHORT])  # SHORT is padded: src (2, 7), tgt_in (2, 6)
    alone = make_batch([SHORT])  # src (1, 3), tgt_in (1, 5)
    with torch.no_grad():
        in_batch = model(batch.src, batch.lengths, batch.tgt_in)[1, :5]  # (5, V)
        by_itself = model(alone.src, alone.lengths, alone.tgt_in)[0]  # (5, V)
        enc_b, enc_a = (
            model.encode(batch.src, batch.lengths),
            model.encode(alone.src, alone.lengths),
        )
    torch.testing.assert_close(in_batch, by_itself, rtol=0, atol=1e-6)
    torch.testing.assert_close(enc_b.values[1, :3], enc_a.values[0], rtol=0, atol=1e-6)
    assert torch.all(enc_b.values[1, 3:] == 0)  # packing: padding never enters the states
    assert (
        model.greedy(batch.src, batch.lengths, 8)[1] == model.greedy(alone.src, alone.lengths, 8)[0]
    )


@pytest.mark.parametrize("rnn", RNN_KINDS)
def test_two_layer_models_are_padding_invariant(rnn: str) -> None:
    model = make_model(make_cfg(rnn, "general", "luong", enc_layers=2, dec_layers=2))
    batch, alone = make_batch([LONG, SHORT]), make_batch([SHORT])
    with torch.no_grad():
        in_batch = model(batch.src, batch.lengths, batch.tgt_in)[1, :5]
        by_itself = model(alone.src, alone.lengths, alone.tgt_in)[0]
    torch.testing.assert_close(in_batch, by_itself, rtol=0, atol=1e-6)


# --- it learns ---------------------------------------------------------------------------------


def reversal_pairs(n: int = 30, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """n distinct (source, reversed source) pairs over symbols 4..13, 3 to 7 long."""
    rng = random.Random(seed)
    pairs: list[tuple[list[int], list[int]]] = []
    while len(pairs) < n:
        src = [rng.randint(4, VOCAB - 1) for _ in range(rng.randint(3, 7))]
        if all(src != s for s, _ in pairs):
            pairs.append((src, src[::-1]))
    return pairs


@pytest.mark.parametrize(
    ("rnn", "attention", "style"),
    [("gru", "additive", "bahdanau"), ("lstm", "general", "luong"), ("gru", "additive", "cgru")],
)
def test_tiny_model_learns_to_reverse_30_sequences(rnn: str, attention: str, style: str) -> None:
    """100 full-batch Adam steps: loss falls below 2% of its start, greedy gets >= 29 of 30 exactly."""
    pairs = reversal_pairs()
    model = make_model(make_cfg(rnn, attention, style, enc_hidden=16, dec_hidden=32, attn_dim=16))
    batch = make_batch(pairs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss(ignore_index=model.cfg.pad_id)
    model.train()
    losses = []
    for _ in range(100):
        logits = model(batch.src, batch.lengths, batch.tgt_in)  # (B, T, V)
        loss = loss_fn(logits.reshape(-1, VOCAB), batch.tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    outputs = model.greedy(batch.src, batch.lengths, max_len=12)
    correct = sum(out == tgt for out, (_, tgt) in zip(outputs, pairs, strict=True))
    assert losses[-1] < 0.02 * losses[0], losses[::20]
    assert correct >= 29, f"{correct}/30 reversed correctly"


# --- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rnn", "attention", "style"),
    [
        ("gru", "additive", "bahdanau"),
        ("lstm", "scaled_dot", "luong"),
        ("gru", "none", "bahdanau"),
        ("lstm", "concat", "cgru"),
    ],
)
def test_checkpoint_round_trip(tmp_path: Path, rnn: str, attention: str, style: str) -> None:
    model = make_model(make_cfg(rnn, attention, style))
    path = tmp_path / "run" / "best.pt"
    save_checkpoint(path, model, {"dev_bleu": 12.5, "step": 7})
    loaded, extra = load_checkpoint(path)
    assert loaded.cfg == model.cfg
    assert extra == {"dev_bleu": 12.5, "step": 7}
    assert not loaded.training
    batch = make_batch([LONG, SHORT])
    with torch.no_grad():
        assert torch.equal(
            loaded(batch.src, batch.lengths, batch.tgt_in),
            model(batch.src, batch.lengths, batch.tgt_in),
        )
    assert not list(tmp_path.glob("run/*.tmp"))  # written atomically


def test_missing_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match=r"checkpoint not found: .*nope\.pt"):
        load_checkpoint(path)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "best.pt"
    save_checkpoint(path, make_model(make_cfg()))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*best\.pt"):
        load_checkpoint(path)


def test_text_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "notes.pt"
    path.write_text("source\ttarget\n")
    with pytest.raises(CheckpointError, match=r"notes\.pt"):
        load_checkpoint(path)


def test_foreign_torch_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    with pytest.raises(CheckpointError, match=r"weights\.pt is not a seq2seq checkpoint"):
        load_checkpoint(path)


def test_checkpoint_whose_weights_do_not_fit_its_config(tmp_path: Path) -> None:
    path = tmp_path / "mixed.pt"
    weights = make_model(make_cfg(attention="additive")).state_dict()
    torch.save({"config": make_cfg(attention="general").to_dict(), "model": weights}, path)
    with pytest.raises(CheckpointError, match=r"mixed\.pt does not match its config"):
        load_checkpoint(path)


# --- ModelConfig validation ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dot", "scaled_dot"])
def test_dot_with_mismatched_dims_says_what_to_do(kind: str) -> None:
    with pytest.raises(
        ValueError, match=r"dec_hidden \(32\) must equal 2 \* enc_hidden \(16\); use 'general'"
    ):
        make_cfg(attention=kind, enc_hidden=8, dec_hidden=32)


@pytest.mark.parametrize("kind", ["general", "additive", "concat", "none"])
def test_mismatched_dims_are_fine_for_general_and_additive(kind: str) -> None:
    """Decoder 32 over a bidirectional encoder of 2 * 8: the model builds and a decoder step gives
    logits (N, V) and attention rows that sum to 1 over the real source tokens (0 for "none")."""
    model = make_model(make_cfg(attention=kind, enc_hidden=8, dec_hidden=32))
    batch = make_batch([LONG, SHORT])
    with torch.no_grad():
        enc = model.encode(batch.src, batch.lengths)
        tokens = torch.full((2,), model.cfg.bos_id, dtype=torch.long)
        logits, state, weights = model.decode_step(
            tokens, enc.state, enc.keys, enc.values, enc.mask
        )
    assert logits.shape == (2, VOCAB) and state.shape == enc.state.shape
    expected = torch.zeros(2) if kind == "none" else torch.ones(2)
    torch.testing.assert_close(weights.sum(-1), expected)
    assert torch.all(weights[~enc.mask] == 0)


def test_config_rejects_unknown_values_and_keys() -> None:
    with pytest.raises(ValueError, match="attention must be one of"):
        make_cfg(attention="cosine")
    with pytest.raises(ValueError, match="rnn must be one of"):
        make_cfg(rnn="transformer")
    with pytest.raises(ValueError, match=r"unknown model config keys: \['heads'\]"):
        ModelConfig.from_dict({**make_cfg().to_dict(), "heads": 4})
    assert ModelConfig.from_dict(make_cfg().to_dict()) == make_cfg()
