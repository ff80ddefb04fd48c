"""A bundle imported from a Marian Transformer written back as the Marian model it came from: the
model.npz and vocabularies that CTranslate2's MarianConverter reads, so that a peer decodes the
same weights (the embedded grc-en-nt-transformer's training run is not kept, only its bundle).

    python -m benchmarks.importing.bundle_to_marian --bundle models/grc-en-nt-transformer \
        --out /tmp/grc-marian [--check]

The inverse of export/importers/marian.py and marian_transformer.py: each layer's weights under
Marian's names (transposed back to x · W), the embeddings and the output bias in Marian's rows
(the spm models' ids, padded with the unknown token to the embeddings' rows: the importer's own
`vocab_order` gives the row of each of our ids), our PAD and BOS rows dropped. The encoder graph's
products carry no names (the exporter folded them into MatMuls): each weight is named by the bias
its MatMul's Add reads. `--check` imports the written model again (s2s-import marian) and holds
every decoder and encoder initializer to the bundle's, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import numpy_helper

from service.model.bundle import load_bundle


def torch_names(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A graph's initializers under the PyTorch module's names, as Linear (out, in) weights: the
    named ones as they are, each unnamed MatMul weight (in, out) transposed and named by the bias
    `<module>.bias` its output is added to."""
    graph = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    named = {k: v for k, v in values.items() if k.startswith("model.")}
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in values:
            continue
        if node.input[1].startswith("model."):
            continue
        adds = [n for n in readers.get(node.output[0], []) if n.op_type == "Add"]
        biases = [i for a in adds for i in a.input if i.endswith(".bias") and i in values]
        if len(biases) != 1:
            raise ValueError(f"{node.name}: no single bias names its weight {node.input[1]}")
        named[biases[0][: -len(".bias")] + ".weight"] = values[node.input[1]].T
    return {k.removeprefix("model."): v for k, v in named.items()}


def marian_rows(bundle: Path, side: str, spm_file: Path, rows: int) -> np.ndarray:
    """our id of each of Marian's rows 0..rows-1 (the importer's own `vocab_order`)."""
    from export.importers.marian import read_vocab, vocab_order, with_rows

    vocab = with_rows(read_vocab(spm_file, side), rows, "the embeddings", side)
    _, order = vocab_order(vocab, side)  # order[our id] = row
    ours_of_row = np.empty(rows + 2, np.int64)
    ours_of_row[np.asarray(order)] = np.arange(len(order))
    return ours_of_row[:rows]


def options_of(bundle: Path, vocab_rows: tuple[int, int]) -> dict[str, Any]:
    """special:model.yml for the bundle's Transformer (the options the importer reads back)."""
    shape = load_bundle(bundle).architecture.transformer
    assert shape is not None, f"{bundle} is not a Transformer"
    return {
        "type": "transformer",
        "dim-emb": shape.d_model,
        "dim-vocabs": list(vocab_rows),
        "enc-depth": shape.enc_layers,
        "dec-depth": shape.dec_layers,
        "transformer-heads": shape.heads,
        "transformer-dim-ffn": shape.ffn_dim,
        "transformer-decoder-dim-ffn": 0,
        "transformer-ffn-depth": 2,
        "transformer-decoder-ffn-depth": 0,
        "transformer-ffn-activation": shape.activation,
        "transformer-preprocess": "",
        "transformer-postprocess": "dan",
        "transformer-postprocess-emb": "d",
        "transformer-postprocess-top": "",
        "transformer-decoder-autoreg": "self-attention",
        "transformer-no-projection": False,
        "transformer-tied-layers": [],
        "transformer-guided-alignment-layer": str(shape.align_layer + 1),
        "transformer-train-position-embeddings": False,
        "tied-embeddings": True,
        "tied-embeddings-src": False,
        "tied-embeddings-all": False,
        "right-left": False,
        "version": "v1.12.42 (written back by benchmarks/importing/bundle_to_marian.py)",
    }


def write_marian(bundle: Path, out: Path) -> tuple[Path, tuple[Path, Path]]:
    """model.npz, source.spm and target.spm under `out` for `bundle`."""
    shape = load_bundle(bundle).architecture.transformer
    assert shape is not None
    enc = torch_names(onnx.load(str(bundle / "encoder.onnx")))
    dec = torch_names(onnx.load(str(bundle / "decoder.onnx")))
    weights = {**enc, **dec}
    if "out.weight" in weights:
        raise ValueError(f"{bundle}: an output layer of its own: only a tied one is written back")
    out.mkdir(parents=True, exist_ok=True)
    vocabs = (out / "source.spm", out / "target.spm")
    shutil.copyfile(bundle / "source.spm.model", vocabs[0])
    shutil.copyfile(bundle / "target.spm.model", vocabs[1])
    src_rows = weights["src_embed.weight"].shape[0] - 2  # ours: Marian's rows + PAD + BOS
    tgt_rows = weights["tgt_embed.weight"].shape[0] - 2
    src_ours = marian_rows(bundle, "source", vocabs[0], src_rows)
    tgt_ours = marian_rows(bundle, "target", vocabs[1], tgt_rows)
    tensors: dict[str, np.ndarray] = {
        "encoder_Wemb": weights["src_embed.weight"][src_ours],
        "decoder_Wemb": weights["tgt_embed.weight"][tgt_ours],
        "decoder_ff_logit_out_b": weights["out.bias"][tgt_ours].reshape(1, -1),
    }
    for i in range(shape.enc_layers):
        attention(tensors, weights, f"encoder_l{i + 1}_self", f"encoder.{i}.self_attn",
                  f"encoder.{i}.attn_norm.norm")  # fmt: skip
        feed_forward(tensors, weights, f"encoder_l{i + 1}_ffn", f"encoder.{i}")
    for i in range(shape.dec_layers):
        ours = f"decoder.{i}"
        attention(tensors, weights, f"decoder_l{i + 1}_self", f"{ours}.self_attn",
                  f"{ours}.self_norm.norm")  # fmt: skip
        attention(tensors, weights, f"decoder_l{i + 1}_context", f"{ours}.cross_attn",
                  f"{ours}.cross_norm.norm")  # fmt: skip
        feed_forward(tensors, weights, f"decoder_l{i + 1}_ffn", ours)
    options = yaml.safe_dump(options_of(bundle, (src_rows, tgt_rows))).encode() + b"\x00"
    tensors["special:model.yml"] = np.frombuffer(options, np.int8)
    model = out / "model.npz"
    np.savez(model, **{k: v.astype(np.float32) if v.dtype != np.int8 else v  # type: ignore[arg-type]
                       for k, v in tensors.items()})  # fmt: skip
    return model, vocabs


def affine(out: dict[str, np.ndarray], w: dict[str, np.ndarray], theirs: str, suffix: str,
           ours: str) -> None:  # fmt: skip
    out[f"{theirs}_W{suffix}"] = np.ascontiguousarray(w[f"{ours}.weight"].T)
    out[f"{theirs}_b{suffix}"] = w[f"{ours}.bias"].reshape(1, -1)


def layer_norm(
    out: dict[str, np.ndarray], w: dict[str, np.ndarray], theirs: str, ours: str
) -> None:
    out[f"{theirs}_ln_scale"] = w[f"{ours}.weight"].reshape(1, -1)
    out[f"{theirs}_ln_bias"] = w[f"{ours}.bias"].reshape(1, -1)


def attention(out: dict[str, np.ndarray], w: dict[str, np.ndarray], theirs: str, ours: str,
              norm: str) -> None:  # fmt: skip
    for proj, short in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out")):
        affine(out, w, theirs, proj, f"{ours}.{short}")
    layer_norm(out, w, f"{theirs}_Wo", norm)


def feed_forward(out: dict[str, np.ndarray], w: dict[str, np.ndarray], theirs: str,
                 ours: str) -> None:  # fmt: skip
    affine(out, w, theirs, "1", f"{ours}.ffn.fc1")
    affine(out, w, theirs, "2", f"{ours}.ffn.fc2")
    layer_norm(out, w, f"{theirs}_ffn", f"{ours}.ffn_norm.norm")


def check(bundle: Path, model: Path, vocabs: tuple[Path, Path]) -> dict[str, Any]:
    """Import the written model again: every initializer equal to the bundle's."""
    from export.importers.marian import import_model

    with tempfile.TemporaryDirectory() as tmp:
        again = import_model(model, vocabs, Path(tmp) / "again", "again", "1")
        compared, different = 0, []
        for graph in ("encoder.onnx", "decoder.onnx"):
            theirs = {
                i.name: numpy_helper.to_array(i)
                for i in onnx.load(str(bundle / graph)).graph.initializer
            }
            ours = {
                i.name: numpy_helper.to_array(i)
                for i in onnx.load(str(again / graph)).graph.initializer
            }
            mine, original = torch_names_of(again / graph), torch_names_of(bundle / graph)
            for name, value in original.items():
                compared += 1
                if name not in mine or not np.array_equal(mine[name], value):
                    different.append(f"{graph}:{name}")
            del theirs, ours
    return {"initializers": compared, "different": different}


def convert_for_ctranslate2(model: Path, vocabs: tuple[Path, Path], out: Path) -> Path:
    """CTranslate2's conversion of the written model (its MarianConverter reads .yml vocabularies
    and fails on the NUL that ends special:model.yml: a copy without it)."""
    import sentencepiece as spm
    from ctranslate2.converters import MarianConverter

    from benchmarks.importing.transformer_speed_marian import without_nul

    ymls = []
    for path in vocabs:
        pieces = spm.SentencePieceProcessor(model_file=str(path))
        lines = [f"{json.dumps(pieces.IdToPiece(i), ensure_ascii=False)}: {i}"
                 for i in range(pieces.GetPieceSize())]  # fmt: skip
        yml = path.with_suffix(".yml")
        yml.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        ymls.append(str(yml))
    stripped = without_nul(model, model.with_name("model.ct2-input.npz"))
    MarianConverter(str(stripped), ymls).convert(str(out), force=True)
    return out


def torch_names_of(path: Path) -> dict[str, np.ndarray]:
    return torch_names(onnx.load(str(path)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--ctranslate2", type=Path, help="also convert it for CTranslate2 here")
    args = parser.parse_args(argv)
    model, vocabs = write_marian(args.bundle, args.out)
    print(f"wrote {model}, {vocabs[0]}, {vocabs[1]}")
    if args.ctranslate2:
        print(f"converted {convert_for_ctranslate2(model, vocabs, args.ctranslate2)}")
    if args.check:
        print(json.dumps(check(args.bundle, model, vocabs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
