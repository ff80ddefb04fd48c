"""What every importer shares: the refusal error, the special-token permutation, bundle writing.

An importer rebuilds the toolkit's network as a torch module with this project's export interface
(`cfg`, `encode(src, lengths) → Encoded`, `decode_step(tokens, state, keys, values, mask) → logits,
new state, attention`), so export/onnx/to_onnx.py writes the same two graphs it writes for our own models
and the server runs them unchanged.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from google.protobuf.message import DecodeError
from torch import Tensor, nn

from export.importers.spm_vocab import restrict_to_vocabulary
from export.onnx.quantize import DEFAULT_SCHEME, quantize_decoder
from export.onnx.to_onnx import export_graphs
from service.model import bundle as bundle_format
from service.model.architecture import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from service.model.manifest import family_of
from service.model.tokenizer import TokenizerError
from service.model.vocab import load_tokenizers


class ImportRefused(ValueError):
    """The checkpoint cannot be imported faithfully; the message says which option or file, and why."""


def refuse_unless(ok: bool, message: str) -> None:
    if not ok:
        raise ImportRefused(message)


def special_order(
    tokens: Sequence[str], pad: str, bos: str, eos: str, unk: str, side: str
) -> list[int]:
    """The toolkit's row of each of our ids: its pad, bos, eos and unk land on PAD, BOS, EOS, UNK (0-3),
    every other token follows in the toolkit's order. Permuting embedding and output rows with this
    keeps the serving contract's fixed special ids."""
    first: dict[str, int] = {}
    for i, token in enumerate(tokens):
        first.setdefault(token, i)
    specials = {PAD_ID: pad, BOS_ID: bos, EOS_ID: eos, UNK_ID: unk}
    rows: list[int] = []
    for our_id in sorted(specials):
        token = specials[our_id]
        if token not in first:
            raise ImportRefused(f"the {side} vocabulary has no {token!r} token")
        rows.append(first[token])
    if len(set(rows)) != len(rows):
        raise ImportRefused(
            f"the {side} vocabulary uses one token for two special roles: {specials}"
        )
    taken = set(rows)
    return rows + [i for i in range(len(tokens)) if i not in taken]


def permuted(weight: Tensor, order: Sequence[int]) -> Tensor:
    """weight (V, ·) or (V,) with its rows in `order` (the rows of our ids)."""
    return weight.detach().float()[torch.as_tensor(list(order), dtype=torch.long)].clone()


def check_rows(name: str, weight: Tensor, vocab_size: int, side: str) -> None:
    refuse_unless(
        weight.shape[0] == vocab_size,
        f"vocabulary size mismatch: {name} has {weight.shape[0]} rows but the {side} vocabulary "
        f"has {vocab_size} tokens",
    )


def load_weights(module: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Copy tensors into module's parameters by name; every parameter must be given, shapes equal."""
    own = dict(module.named_parameters())
    missing = sorted(set(own) - set(tensors))
    refuse_unless(
        not missing, f"the checkpoint lacks weights the configuration needs: {missing[:4]}"
    )
    for name, param in own.items():
        value = tensors[name]
        refuse_unless(
            tuple(value.shape) == tuple(param.shape),
            f"the configuration does not match the checkpoint: {name} is {tuple(value.shape)} in the "
            f"checkpoint but {tuple(param.shape)} by the configuration",
        )
        with torch.no_grad():
            param.copy_(value.float())


def write_vocab(path: Path, tokens: Sequence[str], order: Sequence[int], side: str) -> list[str]:
    """Write tokens in our id order, one a line; refuse tokens a line-based file cannot hold."""
    rows = [tokens[i] for i in order]
    bad = [t for t in rows if not t or any(c.isspace() for c in t)]
    refuse_unless(not bad, f"the {side} vocabulary has tokens with whitespace or empty: {bad[:3]}")
    path.write_text("".join(t + "\n" for t in rows), encoding="utf-8")
    return rows


def document_defaults(cfg: ModelConfig, decoding: dict[str, Any]) -> dict[str, Any]:
    """An imported Transformer was trained on sentences (OPUS-MT's, a toolkit's): a text sent to
    it is cut into sentences unless a request says otherwise (split_sentences "on",
    service/decode/requests/documents.py). Its decoding defaults say so where they do not
    already."""
    if family_of(cfg) != "transformer" or "split_sentences" in decoding:
        return decoding
    return {**decoding, "split_sentences": "on"}


def write_bundle(
    model: nn.Module,
    cfg: ModelConfig,
    vocabs: dict[str, tuple[Sequence[str], Sequence[int]]],
    tokenizer: dict[str, Any],
    out: Path,
    name: str,
    version: str,
    int8: bool,
    info: dict[str, Any],
    files: dict[str, bytes] | None = None,
    decoding: dict[str, Any] | None = None,
    export: Callable[[Any, Path], object] = export_graphs,
) -> Path:
    """Graphs, vocabularies, the tokenizer's `files` (bundle name → content) and manifest,
    written to a temporary directory, verified by loading (tokenizers included), then moved to
    `out`: a failure at any point leaves no bundle behind. decoding: the manifest's decoding
    defaults (option name → value), the toolkit's own where they differ from the server's."""
    parent = out.parent if out.parent.exists() else None
    with tempfile.TemporaryDirectory(dir=parent) as tmp_name:
        tmp = Path(tmp_name)
        export(model, tmp)  # an RNN's exporter, or a Transformer's (export/transformer/graphs.py)
        if int8:
            quantize_decoder(tmp / "decoder.onnx", tmp / "decoder.int8.onnx")
        for side, (tokens, order) in vocabs.items():
            write_vocab(tmp / f"{side}.vocab", tokens, order, side)
        for bundle_name, content in (files or {}).items():
            (tmp / bundle_name).write_bytes(content)
        bundle_format.write_manifest(
            tmp,
            name=name,
            version=version,
            architecture=cfg.to_dict(),
            info={**info, "int8_scheme": DEFAULT_SCHEME} if int8 else info,
            tokenizer=tokenizer,
            decoding=document_defaults(cfg, decoding or {}),
        )
        try:
            load_tokenizers(bundle_format.load_bundle(tmp))
        except TokenizerError as err:
            raise ImportRefused(f"the tokenizer does not load: {err}") from err
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tmp, out)
    out.chmod(0o755)
    return out


def subword_side(
    segmenter: str,
    model: Path,
    side: str,
    lowercase: bool = False,
    append_eos: bool = False,
    restrict_to: Sequence[str] | None = None,
    separator: str = "@@",
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """One side of a manifest's "subword" tokenizer section (service/model/vocab.py reads it), and
    its segmenter file by bundle name. restrict_to: the vocabulary the toolkit restricts the
    segmenter to (Joey NMT): baked into a SentencePiece model here, applied by the server to BPE."""
    refuse_unless(model.is_file(), f"the {side} {segmenter} model is not found: {model}")
    content = model.read_bytes()
    if segmenter == "sentencepiece":
        name = f"{side}.spm.model"
        if restrict_to is not None:
            try:
                content = restrict_to_vocabulary(content, restrict_to)
            except DecodeError as err:
                raise ImportRefused(f"{model} is not a sentencepiece model: {err}") from err
    else:
        name = f"{side}.bpe.codes"
    section: dict[str, Any] = {
        "file": f"{side}.vocab",
        "segmenter": segmenter,
        "model": name,
        "lowercase": lowercase,
        "append_eos": append_eos,
    }
    if segmenter == "bpe":
        section["separator"] = separator
        section["restrict_to_vocabulary"] = restrict_to is not None
    return section, {name: content}


def load_torch_file(path: Path, what: str) -> Any:
    """torch.load with weights_only=True: tensors and plain containers only, plus argparse.Namespace
    (OpenNMT-py pickles its options as one). A file that is not a checkpoint, or that would need
    any other class to unpickle, is refused."""
    if not path.is_file():
        raise ImportRefused(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a file that is not a checkpoint
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ImportRefused(
            f"{path} is not a PyTorch checkpoint of {what}: {type(err).__name__}: {message}"
        ) from err
