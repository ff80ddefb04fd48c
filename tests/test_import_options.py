"""The importers' option tables (export/importers/options.py): a checkpoint with several options the
importer does not rebuild is refused once, in one line that names every one of them (the option as
the toolkit's users write it and the value found), and no bundle is written.

Per toolkit, a real tiny checkpoint (built as the toolkit's own import tests build theirs) with three
wrong options. Each is skipped where its toolkit is not installed.
"""

from __future__ import annotations

import copy
import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from export.importers.common import ImportRefused
from export.importers.options import Option, OptionTable, check


def refused_naming(out: Path, run: Any, *named: str) -> str:
    """run() raises ImportRefused once; its one-line message names every one of `named`."""
    with pytest.raises(ImportRefused) as err:
        run()
    message = str(err.value)
    assert "\n" not in message
    for needle in named:
        assert needle in message, message
    assert message.startswith("unsupported ") and " options" in message, message
    assert not out.exists()
    return message


# --- the table itself ---------------------------------------------------------------------------


TABLE = OptionTable("Toy", "--", (
    Option("cell", ("gru", "lstm"), "gru", to="ModelConfig.rnn"),
    Option("layers", default=1, to="ModelConfig.enc_layers", convert=int),
    Option("dec-layers", lambda v, o: v == o["layers"], default_from="layers",
           accepted=lambda o: f"equal to --layers {o['layers']}", to="ModelConfig.dec_layers"),
    Option("tokenizer", ("spm",), "spm", when=lambda o: o["level"] == "subword"),
    Option("level", ("word", "subword"), "word"),
))  # fmt: skip


def test_a_table_maps_what_it_accepts_with_defaults_and_dependent_defaults() -> None:
    mapped = check(TABLE, {"cell": "lstm", "layers": "2", "tokenizer": "bpe"})  # level: word
    assert mapped == {"ModelConfig.rnn": "lstm", "ModelConfig.enc_layers": 2,
                      "ModelConfig.dec_layers": "2"}  # fmt: skip
    assert check(TABLE, Namespace(layers=3, **{"dec-layers": 3}))["ModelConfig.dec_layers"] == 3


def test_a_table_refuses_every_problem_at_once() -> None:
    config = {"cell": "rnn", "layers": 2, "dec-layers": 3, "level": "subword", "tokenizer": "bpe"}
    with pytest.raises(ImportRefused) as err:
        check(TABLE, config, "toy.yml")
    assert str(err.value) == (
        "unsupported Toy options in toy.yml: --cell 'rnn' (the importer supports ['gru', 'lstm']); "
        "--dec-layers 3 (equal to --layers 2); --tokenizer 'bpe' (the importer supports ['spm'])"
    )


# --- OpenNMT-py ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onmt_base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/test_import.py's onmt_base: a checkpoint of one training step (only its format used)."""
    pytest.importorskip("onmt")
    pytest.importorskip("joeynmt")
    from export.importers.common import load_torch_file
    from export.toolkits import toolkits
    from tests.test_import import ONMT_DEFAULT

    task = toolkits.make_task(tmp_path_factory.mktemp("task"), n_train=200, n_test=5)
    ckpt = toolkits.train_onmt(task, tmp_path_factory.mktemp("onmt"), ONMT_DEFAULT, steps=1)
    return dict(load_torch_file(ckpt, "OpenNMT-py"))


def with_options(base: dict[str, Any], path: Path, changes: dict[str, Any]) -> Path:
    ckpt = dict(base)
    ckpt["opt"] = copy.deepcopy(base["opt"])
    for name, value in changes.items():
        setattr(ckpt["opt"], name, value)
    import torch

    torch.save(ckpt, path)
    return path


def test_opennmt_rnn_names_three_wrong_options(onmt_base: dict[str, Any], tmp_path: Path) -> None:
    from export.importers import opennmt

    wrong = {"copy_attn": True, "global_attention_function": "sparsemax", "dec_layers": 3}
    ckpt = with_options(onmt_base, tmp_path / "m.pt", wrong)
    out = tmp_path / "bundle"
    refused_naming(
        out,
        lambda: opennmt.import_checkpoint(ckpt, out, "x", "1"),
        "-copy_attn True",
        "-global_attention_function 'sparsemax'",
        "-dec_layers 3",
    )


def test_opennmt_transformer_names_three_wrong_options(
    onmt_base: dict[str, Any], tmp_path: Path
) -> None:
    from export.importers import opennmt
    from tests.test_import import onmt_checkpoint
    from tests.test_import_onmt_transformer import TRANSFORMER

    built = tmp_path / "t.pt"
    onmt_checkpoint(built, onmt_base, TRANSFORMER, seed=3)
    from export.importers.common import load_torch_file

    wrong = {"self_attn_type": "average", "pos_ffn_activation_fn": "silu", "alignment_layer": 5}
    ckpt = with_options(load_torch_file(built, "OpenNMT-py"), tmp_path / "m.pt", wrong)
    out = tmp_path / "bundle"
    refused_naming(
        out,
        lambda: opennmt.import_checkpoint(ckpt, out, "x", "1"),
        "-self_attn_type 'average'",
        "-pos_ffn_activation_fn 'silu'",
        "-alignment_layer 5",
    )


# --- Joey NMT -----------------------------------------------------------------------------------


def test_joeynmt_names_three_wrong_options(tmp_path: Path) -> None:
    pytest.importorskip("onmt")
    pytest.importorskip("joeynmt")
    import torch
    import yaml

    from export.importers import joeynmt
    from export.toolkits import toolkits
    from tests.test_import import JOEY_GRU_BAHDANAU, joey_model

    words = [f"w{i}" for i in range(40)]
    model = joey_model(JOEY_GRU_BAHDANAU, words, [w.upper() for w in words], seed=0)
    torch.save({"model_state": model.state_dict()}, tmp_path / "best.ckpt")
    (tmp_path / "src_vocab.txt").write_text("\n".join(model.src_vocab._itos) + "\n")
    (tmp_path / "trg_vocab.txt").write_text("\n".join(model.trg_vocab._itos) + "\n")
    config = toolkits.joey_config(tmp_path, tmp_path, copy.deepcopy(JOEY_GRU_BAHDANAU))
    config["model"]["encoder"]["type"] = "transformer"
    config["model"]["decoder"]["attention"] = "multihead"
    config["data"]["src"]["normalize"] = True
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "bundle"
    refused_naming(
        out,
        lambda: joeynmt.import_checkpoint(
            tmp_path / "config.yaml", tmp_path / "best.ckpt", out, "x", "1"
        ),
        "model.encoder.type 'transformer'",
        "model.decoder.attention 'multihead'",
        "data.src.normalize True",
    )


# --- Hugging Face -------------------------------------------------------------------------------


def test_huggingface_names_three_wrong_options(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from export.importers.huggingface import import_model
    from export.toolkits.hf_fixture import write_model

    directory = write_model(tmp_path / "marian")
    config = json.loads((directory / "config.json").read_text())
    config |= {"activation_function": "tanh", "normalize_before": True, "decoder_ffn_dim": 48}
    (directory / "config.json").write_text(json.dumps(config))
    out = tmp_path / "bundle"
    message = refused_naming(
        out,
        lambda: import_model(directory, out, "x", "1"),
        "activation_function 'tanh'",
        "normalize_before True",
        "decoder_ffn_dim 48",
    )
    assert "config.json" in message


# --- Marian -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny s2s model and a tiny Transformer trained by Marian (a second each)."""
    pytest.importorskip("pymarian")
    from export.toolkits import marian_toolkit as mt

    root = tmp_path_factory.mktemp("marian")
    return {
        "s2s": mt.train_demo(root / "s2s", n_test=5, after="1e"),
        "transformer": mt.train_demo(root / "tr", kind="transformer", n_test=5, after="1e"),
    }


@pytest.mark.parametrize(
    ("kind", "wrong", "named"),
    [
        ("s2s", {"skip": True, "enc_depth": 2, "dec_cell": "mgru"},
         ["--skip True", "--enc-depth 2", "--dec-cell 'mgru'"]),
        ("transformer", {"transformer_preprocess": "n", "transformer_ffn_depth": 3,
                         "transformer_attention_mask": "alibi"},
         ["--transformer-preprocess 'n'", "--transformer-ffn-depth 3",
          "--transformer-attention-mask 'alibi'"]),
    ],
)  # fmt: skip
def test_marian_names_three_wrong_options(
    marian_models: dict[str, Path],
    tmp_path: Path,
    kind: str,
    wrong: dict[str, object],
    named: list[str],
) -> None:
    from export.importers import marian
    from export.toolkits import marian_toolkit as mt

    trained = marian_models[kind]
    model = mt.rewrite_options(trained, tmp_path / "model.npz", wrong)
    names = ("vocab.spm", "vocab.spm") if kind == "transformer" else ("src.spm", "tgt.spm")
    vocabs = (trained.parent / names[0], trained.parent / names[1])
    out = tmp_path / "bundle"
    refused_naming(out, lambda: marian.import_model(model, vocabs, out, "x", "1"), *named)
