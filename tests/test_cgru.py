"""The conditional (cGRU, Nematus/Marian) decoder style: what makes it conditional, that it learns,
and that a trained tiny cgru model is exported and served like the other styles."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from export.train.data import make_batch
from export.train.model import Seq2Seq
from service.model.architecture import RNN_KINDS
from tests.test_model import make_cfg

torch.set_num_threads(1)


def step_weights(model: Seq2Seq, token: int) -> torch.Tensor:
    """Attention weights (1, S) of the first decoder step from the same state, fed `token`."""
    batch = make_batch([([4, 5, 6, 7, 8], [9, 10])])
    with torch.no_grad():
        enc = model.encode(batch.src, batch.lengths)
        _, _, weights = model.decode_step(
            torch.tensor([token]), enc.state, enc.keys, enc.values, enc.mask
        )
    return weights


@pytest.mark.parametrize("rnn", RNN_KINDS)
def test_cgru_attends_after_reading_the_previous_token(rnn: str) -> None:
    """The defining difference: from one state, Bahdanau's attention cannot depend on y_{t-1} (it is
    queried with s_{t-1}); cGRU's must (queried with s'_t = RNN1(y_{t-1}, s_{t-1}))."""
    torch.manual_seed(0)
    cgru = Seq2Seq(make_cfg(rnn, style="cgru")).eval()
    torch.manual_seed(0)
    bahdanau = Seq2Seq(make_cfg(rnn, style="bahdanau")).eval()
    assert torch.equal(step_weights(bahdanau, 4), step_weights(bahdanau, 11))
    assert (step_weights(cgru, 4) - step_weights(cgru, 11)).abs().max() > 1e-4


def test_cgru_parameters_are_the_two_transitions() -> None:
    """RNN1 reads the embedding (E), RNN2 (stacked) reads the context (D), each of width H."""
    model = Seq2Seq(make_cfg("lstm", style="cgru", dec_layers=2))
    cfg = model.cfg
    assert model.rnn1.input_size == cfg.emb_dim and model.rnn1.num_layers == 1
    assert model.rnn.input_size == cfg.enc_out_dim and model.rnn.num_layers == 2
    assert cfg.state_dim == 2 * 2 * cfg.dec_hidden  # h and c of two layers, no input feed


@pytest.mark.parametrize("rnn", RNN_KINDS)
def test_two_layer_cgru_is_padding_invariant(rnn: str) -> None:
    torch.manual_seed(0)
    model = Seq2Seq(make_cfg(rnn, "general", "cgru", dec_layers=2, enc_layers=2)).eval()
    long, short = ([4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 4, 5]), ([9, 10, 11], [12, 13, 4, 5])
    batch, alone = make_batch([long, short]), make_batch([short])
    with torch.no_grad():
        in_batch = model(batch.src, batch.lengths, batch.tgt_in)[1, :5]
        by_itself = model(alone.src, alone.lengths, alone.tgt_in)[0]
    torch.testing.assert_close(in_batch, by_itself, rtol=0, atol=1e-6)


def test_cgru_refuses_input_feeding_and_imported_toolkits() -> None:
    with pytest.raises(ValueError, match="'cgru' has no input feeding"):
        make_cfg(style="cgru", input_feed=True)
    with pytest.raises(ValueError, match="'cgru' is native or marian only, not 'joeynmt'"):
        make_cfg(style="cgru", toolkit="joeynmt")
    assert make_cfg(style="cgru", toolkit="marian").conditional  # Marian's s2s, imported
    assert not make_cfg(
        attention="none", style="cgru"
    ).conditional  # style ignored without attention


def test_tiny_cgru_model_trains_exports_and_serves(tmp_path: Path) -> None:
    """s2s-train's train() with decoder_style "cgru" on a generated corpus, then export_bundle and the
    serving Engine: its beam-3 n-best equals the same numpy beam search over the PyTorch step."""
    pytest.importorskip("num2words")
    pytest.importorskip("babel")
    pytest.importorskip("sacrebleu")
    from export.data.corpus import read_tsv
    from export.onnx.to_onnx import export_bundle
    from export.train.checkpoint import load_checkpoint
    from export.train.torch_decoder import TorchDecoder
    from export.train.train import DataConfig, OptimConfig, TrainConfig, train
    from service.decode.engine.engine import Engine
    from service.decode.runtime.encoded import pad_ids
    from service.decode.search.beam import SearchOptions, beam_search
    from service.decode.shared.config import RuntimeConfig
    from service.model.tokenizer import Tokenizer

    cfg = TrainConfig(
        model={
            "emb_dim": 16,
            "enc_hidden": 16,
            "dec_hidden": 32,
            "attn_dim": 16,
            "dropout": 0.0,
            "decoder_style": "cgru",
        },
        data=DataConfig(
            generate_seed=5, n_train=150, n_dev=10, n_test=10, n_test_long=2,
            src_vocab=100, tgt_vocab=120,
        ),
        optim=OptimConfig(max_steps=8, max_tokens=800, eval_every=4, max_minutes=10, threads=1),
    )  # fmt: skip
    run = tmp_path / "run"
    summary = train(cfg, run, quiet=True)
    assert summary["steps"] == 8
    bundle = export_bundle(run / "best.pt", run, tmp_path / "bundle", name="c", version="0.0.1")
    engine = Engine.load(
        bundle, RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    )
    assert engine.bundle.architecture.decoder_style == "cgru"
    sources = [s for s, _ in read_tsv(run / "data" / "test.tsv")][:6]
    opts = SearchOptions(beam_size=3, n_best=2, max_length_a=1.0, max_length_b=5)
    got = engine.translate(sources, opts, alignment="subword")
    model, _ = load_checkpoint(run / "best.pt")
    src_tok = Tokenizer.load(run / "source.model")
    src, lengths = pad_ids([src_tok.encode(s) for s in sources])
    ref = beam_search(
        TorchDecoder(model, src, lengths),
        lengths.tolist(),
        opts,
        model.cfg.bos_id,
        model.cfg.eos_id,
        model.cfg.tgt_vocab_size,
    )
    for translation, ref_hyps in zip(got, ref, strict=True):
        assert [h.token_ids for h in translation.hypotheses] == [h.tokens for h in ref_hyps]
        for h, r in zip(translation.hypotheses, ref_hyps, strict=True):
            assert h.score == pytest.approx(r.score, abs=1e-4)
            assert h.alignment is not None
