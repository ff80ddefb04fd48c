"""The one builder of an imported model's ModelConfig (and a Transformer's shape) that every
importer fills: from what its option table mapped (export/importers/options.py) and what it read
off the weights or fixes for its toolkit's equations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.transformer.model import TransformerSeq2Seq
from service.model.architecture import ModelConfig, Toolkit, TransformerShape


def model_config(
    toolkit: Toolkit,
    vocab_sizes: tuple[int, int],
    mapped: Mapping[str, Any],
    shape: Mapping[str, Any] | None = None,
    **fields: Any,
) -> ModelConfig:
    """ModelConfig of (source, target) `vocab_sizes` at inference (no dropout). `mapped`: what a
    table mapped ("ModelConfig.<field>", "TransformerShape.<field>" → value); `shape` and `fields`:
    the TransformerShape's and ModelConfig's fields the table does not map (fixed by the toolkit's
    equations, read off the weights, or defaults where the table maps nothing). With any
    TransformerShape field it is a Transformer: scaled dot-product attention, embeddings d_model
    wide, its decoder's states."""
    own = {**fields, **_fields(mapped, "ModelConfig.")}
    dims = {**(shape or {}), **_fields(mapped, "TransformerShape.")}
    if dims:
        transformer = TransformerShape(**dims)
        own |= {
            "emb_dim": transformer.d_model,
            "attention": "scaled_dot",
            "decoder_states": TransformerSeq2Seq.state_specs(transformer),
            "transformer": transformer,
        }
    src, tgt = vocab_sizes
    return ModelConfig(src_vocab_size=src, tgt_vocab_size=tgt, dropout=0.0, toolkit=toolkit, **own)


def _fields(mapped: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {k.removeprefix(prefix): v for k, v in mapped.items() if k.startswith(prefix)}
