"""Shared fixtures: a tiny model (random weights, real tokenizers) exported as a bundle, once per session."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from service.decode.runtime.providers import cuda_session_loads
from service.model.architecture import ModelConfig
from service.model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from export.train.model import Seq2Seq

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BUNDLE = REPO / "models" / "default"
# The CUDA provider's tests run where onnxruntime-gpu can make a CUDA session (scripts/gpu_check.sh
# runs them on a GPU host); here they are skipped, and the same code runs under the CPU provider.
needs_cuda = pytest.mark.skipif(
    not cuda_session_loads(),
    reason="needs the CUDA execution provider (onnxruntime-gpu and an NVIDIA GPU): "
    "scripts/gpu_check.sh runs these on a GPU host",
)


def start_server_process(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """`python -m service.serve.server *argv` from the repository, its output into log_path, with no S2S_
    variable of the caller's environment (the flags alone configure it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "service.serve.server", *argv],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def empty_caches(decoder: Any, rows: int) -> dict[str, Any]:
    """A Transformer decoder step's self-attention caches with no entries, as its inputs declare
    them: (rows, 0, width) or, kept head by head, (rows, heads, 0, width / heads)."""
    import numpy as np

    return {
        i.name: np.zeros([rows, *(0 if isinstance(d, str) else d for d in i.shape[1:])], np.float32)
        for i in decoder.get_inputs()
        if i.name.startswith("self_")
    }


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll until condition() holds; fail the test after `timeout` seconds (a passing test never waits
    that long: it is the bound for a loaded CI machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


@dataclass(frozen=True)
class TinyModel:
    checkpoint: Path
    bundle: Path
    model: Seq2Seq
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    sources: list[str]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A randomly initialised additive-attention GRU model with real tokenizers, as checkpoint and bundle."""
    # imported here, not at the top: the tests that need no model (the CUDA ones a GPU host runs
    # from scripts/gpu_check.sh) must not need torch and the training extras
    import torch

    from export.data.corpus import generate_splits
    from export.data.tokenizer import train_tokenizers
    from export.onnx.to_onnx import export_bundle
    from export.train.checkpoint import save_checkpoint
    from export.train.model import Seq2Seq

    root = tmp_path_factory.mktemp("tiny")
    pairs = generate_splits(seed=7, n_train=400, n_dev=10, n_test=10, n_test_long=2)["train"]
    src_path, tgt_path = train_tokenizers(pairs, root, src_vocab=120, tgt_vocab=140)
    src_tok, tgt_tok = Tokenizer.load(src_path), Tokenizer.load(tgt_path)
    torch.manual_seed(0)
    cfg = ModelConfig(
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        emb_dim=16,
        enc_hidden=16,
        dec_hidden=32,
        attn_dim=16,
    )
    model = Seq2Seq(cfg).eval()
    checkpoint = root / "tiny.pt"
    save_checkpoint(checkpoint, model)
    bundle = export_bundle(
        checkpoint, root, root / "bundle", name="tiny", version="0.0.1", int8=True
    )
    return TinyModel(checkpoint, bundle, model, src_tok, tgt_tok, [s for s, _ in pairs[:40]])
