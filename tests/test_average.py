"""export/train/average.py: the decoder side averaged over checkpoints, the encoder kept exactly
(so a link head trained on its states stays valid); mismatched architectures refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from export.train import average
from export.train.checkpoint import load_checkpoint, save_checkpoint
from export.train.model import Seq2Seq
from service.model.architecture import ModelConfig

CFG = ModelConfig(
    src_vocab_size=20, tgt_vocab_size=22, emb_dim=8, enc_hidden=8, dec_hidden=12, attn_dim=8
)


def model(seed: int, cfg: ModelConfig = CFG) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(cfg).eval()


def test_decoder_is_the_mean_and_the_encoder_is_kept() -> None:
    a, b, c = model(1), model(2), model(3)
    want = {
        k: (a.state_dict()[k] + b.state_dict()[k] + c.state_dict()[k]) / 3 for k in a.state_dict()
    }
    kept = {k: v.clone() for k, v in b.state_dict().items()}
    out = average.average_decoders(b, [a, b, c]).state_dict()
    for name, value in out.items():
        if name.startswith("encoder."):
            assert torch.equal(value, kept[name]), name
        else:
            assert torch.allclose(value, want[name], atol=1e-6), name
    assert any(not torch.equal(out[k], kept[k]) for k in out if not k.startswith("encoder."))


def test_other_architectures_are_refused() -> None:
    other = model(4, ModelConfig(**{**CFG.to_dict(), "dec_hidden": 16}))
    with pytest.raises(ValueError, match="different architectures"):
        average.average_decoders(model(1), [other])


def test_command_writes_a_checkpoint(tmp_path: Path) -> None:
    for i in (1, 2):
        save_checkpoint(tmp_path / f"{i}.pt", model(i), {"step": i, "dev_bleu": 10.0 + i})
    out = tmp_path / "avg.pt"
    args = [
        "--encoder",
        str(tmp_path / "1.pt"),
        "--average",
        str(tmp_path / "1.pt"),
        str(tmp_path / "2.pt"),
    ]
    assert average.main([*args, "--out", str(out)]) == 0
    averaged, meta = load_checkpoint(out)
    assert meta["step"] == 1 and len(meta["averaged"]) == 2
    assert meta["dev_bleu"] is None  # the encoder checkpoint's score is not the average's
    assert torch.equal(
        averaged.state_dict()["encoder.embed.weight"], model(1).state_dict()["encoder.embed.weight"]
    )
    assert (
        average.main(
            ["--encoder", str(tmp_path / "none.pt"), "--average", str(out), "--out", str(out)]
        )
        == 2
    )
