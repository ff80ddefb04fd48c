"""Export a checkpoint to ONNX as an encoder graph and a decoder-step graph, packed into a bundle.

    s2s-export --checkpoint runs/default/best.pt --tokenizers runs/default --out models/default \
        --name numbers-en-fr --version 1.0.0 [--int8]

The decoder step does the beam's state reorder (Gather by back-pointers), log-softmax and TopK inside
the graph: only k candidates per hypothesis reach the host, and the recurrent state can stay on the
device between steps. Its target embedding is folded into the products it enters (a table row per
token instead of an embedding times a matrix per hypothesis, export.train.model.FoldedEmbedding).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import warnings
from copy import deepcopy
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from torch import Tensor, nn

from export.onnx.quantize import DEFAULT_SCHEME, quantize_decoder
from export.train.checkpoint import load_checkpoint
from export.train.model import Seq2Seq
from export.train.torch_decoder import top_k_log_probs
from service.model import bundle as bundle_format
from service.model import graph_contract as contract
from service.model.input_rule import InputRule

OPSET = 17
# The graphs' input and output names, in the order of the forward() arguments: the runtime's contract.
ENCODER_INPUTS = [port.name for port in contract.ENCODER_INPUTS]
ENCODER_OUTPUTS = [port.name for port in contract.ENCODER_OUTPUTS]
DECODER_INPUTS = [port.name for port in contract.DECODER_INPUTS]
DECODER_OUTPUTS = [port.name for port in contract.DECODER_OUTPUTS]
ENCODER_AXES = {
    "src": {0: "batch", 1: "src_len"},
    "src_lengths": {0: "batch"},
    "values": {0: "batch", 1: "src_len"},
    "keys": {0: "batch", 1: "key_len"},
    "mask": {0: "batch", 1: "src_len"},
    "state": {0: "batch"},
}
DECODER_AXES = {
    "tokens": {0: "hyps"},
    "state": {0: "state_rows"},
    "reorder": {0: "hyps"},
    "values": {0: "batch", 1: "src_len"},
    "keys": {0: "batch", 1: "key_len"},
    "mask": {0: "batch", 1: "src_len"},
    "log_probs": {0: "hyps", 1: "k"},
    "token_ids": {0: "hyps", 1: "k"},
    "new_state": {0: "hyps"},
    "attention": {0: "hyps", 1: "src_len"},
}


class EncoderGraph(nn.Module):
    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        enc = self.model.encode(src, src_lengths)
        return enc.values, enc.keys, enc.mask, enc.state


class DecoderStepGraph(nn.Module):
    """tokens (N,), state (R, D_state), reorder (N,) → top-k of log p(y | ·) per row, new state, attention."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        tokens: Tensor,
        state: Tensor,
        reorder: Tensor,
        values: Tensor,
        keys: Tensor,
        mask: Tensor,
        k: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        state = state.index_select(0, reorder)  # (N, D_state): follow the beam's back-pointers
        logits, new_state, attention = self.model.decode_step(tokens, state, keys, values, mask)
        step_log_probs = getattr(self.model, "step_log_probs", None)  # an imported toolkit's rule
        if step_log_probs is not None:
            top_lp, top_ids = torch.topk(step_log_probs(logits, tokens), cast(int, k), dim=-1)
        else:
            top_lp, top_ids = top_k_log_probs(logits, k)
        return top_lp, top_ids, new_state, attention


# FoldedEmbedding trades N·E·G·H multiply-adds per step for a table lookup; past this size the
# decoder file would grow more than the step gains (a 32k-word vocabulary into a 4x1024 LSTM: 512 MB).
FOLD_LIMIT_BYTES = 64 * 2**20


def with_folded_embeddings(model: nn.Module, limit_bytes: int = FOLD_LIMIT_BYTES) -> nn.Module:
    """A copy of model whose decoder step looks up its target embedding's products (the model's
    `fold_embeddings`), or model itself when it has none or the tables would exceed limit_bytes."""
    fold = getattr(model, "fold_embeddings", None)
    if fold is None:
        return model
    folded = fold()
    if folded.nbytes > limit_bytes:
        return model
    copy = deepcopy(model)
    copy.folded = folded
    return copy


def example_inputs(
    model: Seq2Seq, B: int = 2, S: int = 5, K: int = 3
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    cfg = model.cfg
    src = torch.randint(4, cfg.src_vocab_size, (B, S))
    lengths = torch.tensor([S] + [max(1, S - 2)] * (B - 1))
    with torch.no_grad():
        enc = model.encode(src, lengths)
    N = B * K
    reorder = torch.arange(B).repeat_interleave(K)  # every slot starts from its sentence's state
    tokens = torch.full((N,), cfg.bos_id, dtype=torch.long)
    k = torch.tensor(K, dtype=torch.long)
    return (src, lengths), (tokens, enc.state, reorder, enc.values, enc.keys, enc.mask, k)


def export_graphs(
    model: Seq2Seq, out_dir: Path, fold_limit_bytes: int = FOLD_LIMIT_BYTES
) -> tuple[Path, Path]:
    """Write encoder.onnx and decoder.onnx (dynamic batch, hypothesis and source-length axes); the
    decoder step with folded embeddings where they fit fold_limit_bytes (with_folded_embeddings)."""
    model.eval()
    enc_inputs, dec_inputs = example_inputs(model)
    encoder_path, decoder_path = out_dir / "encoder.onnx", out_dir / "decoder.onnx"
    with warnings.catch_warnings():
        # The tracer warns that RNN shape checks become constants and that GRU/LSTM exports with a
        # batch other than 1 may not generalize; tests/test_export.py runs the graphs at other batch
        # sizes and lengths against PyTorch, which is the check that matters.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings(
            "ignore", message="Exporting a model to ONNX with a batch_size other than 1"
        )
        warnings.filterwarnings(
            "ignore", message="You are using the legacy TorchScript-based ONNX export"
        )
        export_graph(
            EncoderGraph(model),
            enc_inputs,
            encoder_path,
            (ENCODER_INPUTS, ENCODER_OUTPUTS),
            ENCODER_AXES,
        )
        export_graph(
            DecoderStepGraph(cast(Seq2Seq, with_folded_embeddings(model, fold_limit_bytes))),
            dec_inputs,
            decoder_path,
            (DECODER_INPUTS, DECODER_OUTPUTS),
            DECODER_AXES,
        )
    for path in (encoder_path, decoder_path):
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return encoder_path, decoder_path


def export_graph(
    module: nn.Module,
    inputs: tuple[Tensor, ...],
    path: Path,
    names: tuple[list[str], list[str]],
    axes: dict[str, dict[int, str]],
) -> None:
    """One graph through the TorchScript exporter (the dynamo exporter fails on packed sequences)."""
    torch.onnx.export(
        module.eval(),
        inputs,
        str(path),
        input_names=names[0],
        output_names=names[1],
        dynamic_axes=axes,
        opset_version=OPSET,
        dynamo=False,
    )


def export_bundle(
    checkpoint: Path,
    tokenizers: Path,
    out: Path,
    name: str,
    version: str,
    int8: bool = False,
    extra: dict[str, Any] | None = None,
    input_rule: InputRule | None = None,
    sections: dict[str, Any] | None = None,
) -> Path:
    """Checkpoint + tokenizers → a verified bundle directory (written to a temp dir, then moved into place).

    sections: further manifest sections by name ("segmentation", "confidence"), as
    service/model/bundle.py's write_manifest takes them."""
    model, meta = load_checkpoint(checkpoint)
    if input_rule is None and meta.get("train_config", {}).get("data", {}).get("lowercase_source"):
        input_rule = InputRule(lowercase=True)  # the run lower-cased its sources: serving must too
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp_name:
        tmp = Path(tmp_name)
        export_graphs(model, tmp)
        if int8:
            quantize_decoder(tmp / "decoder.onnx", tmp / "decoder.int8.onnx")
        for side in ("source", "target"):
            shutil.copyfile(tokenizers / f"{side}.model", tmp / f"{side}.model")
        info = {"dev_bleu": meta.get("dev_bleu"), "train_step": meta.get("step"), **(extra or {})}
        if int8:
            info["int8_scheme"] = DEFAULT_SCHEME
        if "averaged" in meta:  # export/train/average.py: which checkpoints, whose encoder
            info["averaged"] = {"decoder_over": meta["averaged"], "encoder_of": meta["encoder"]}
        bundle_format.write_manifest(
            tmp,
            name=name,
            version=version,
            architecture=model.cfg.to_dict(),
            info=info,
            input_rule=input_rule,
            **(sections or {}),
        )
        bundle_format.load_bundle(tmp)  # verify what we wrote before it replaces anything
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tmp, out)
    out.chmod(
        0o755
    )  # the temporary directory was private; the bundle is meant to be read by the server's user
    return out


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument(
        "--tokenizers",
        required=True,
        type=Path,
        help="directory with source.model and target.model",
    )
    parser.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    parser.add_argument("--name", default="seq2seq")
    parser.add_argument("--version", default="0.1.0")
    parser.add_argument("--int8", action="store_true", help="also write decoder.int8.onnx")
    parser.add_argument(
        "--info", type=Path, help="JSON file of figures to record in the manifest (e.g. test BLEU)"
    )
    parser.add_argument(
        "--input-rule",
        type=json.loads,
        help='JSON input rule for the manifest, e.g. \'{"lowercase": true, "alphabet": "abc", "max_chars": 40}\' '
        "(see service/model/input_rule.py; absent: any text)",
    )
    parser.add_argument(
        "--segmentation",
        type=Path,
        help="JSON file of the boundaries where long inputs are cut (the manifest's "
        "'segmentation', see service/model/segment.py), e.g. configs/numbers-segmentation.json",
    )
    parser.add_argument(
        "--min-confidence",
        type=float,
        help="the manifest's default confidence threshold in [0, 1]: hypotheses below it are "
        "marked low_confidence (a server's --min-confidence overrides it)",
    )
    args = parser.parse_args(argv)
    extra = json.loads(args.info.read_text()) if args.info else None
    rule = InputRule.from_dict(args.input_rule) if args.input_rule else None
    sections: dict[str, Any] = {}
    if args.segmentation:
        sections["segmentation"] = json.loads(args.segmentation.read_text(encoding="utf-8"))
    if args.min_confidence is not None:
        sections["confidence"] = {"threshold": args.min_confidence}
    out = export_bundle(
        args.checkpoint,
        args.tokenizers,
        args.out,
        args.name,
        args.version,
        args.int8,
        extra,
        rule,
        sections,
    )
    print(f"wrote bundle {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
