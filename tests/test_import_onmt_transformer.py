"""s2s-import opennmt-py on Transformer checkpoints: every step of the imported graphs computes
what OpenNMT-py's own modules compute, and the alignment is its `-report_align` attention.

Checkpoints with random weights are built by OpenNMT-py itself from a trained checkpoint's options
(tests/test_import.py's onmt_checkpoint), over the options the importer rebuilds; refused options
are refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onmt")

from export.importers import cli, opennmt  # noqa: E402
from export.importers.common import ImportRefused  # noqa: E402
from export.toolkits import toolkits  # noqa: E402
from service.decode.engine.engine import Engine  # noqa: E402
from tests.conftest import empty_caches  # noqa: E402
from tests.test_import import onmt_base, onmt_checkpoint, task  # noqa: E402, F401

TRANSFORMER = {
    "encoder_type": "transformer",
    "decoder_type": "transformer",
    "position_encoding": True,
    "layers": 2,
    "enc_layers": 2,
    "dec_layers": 2,
    "hidden_size": 32,
    "word_vec_size": 32,
    "heads": 4,
    "transformer_ff": 64,
    "self_attn_type": "scaled-dot",
    "alignment_layer": -1,
    "alignment_heads": 0,
    "lambda_align": 0.05,  # trained to align: the bundle reads alignment_layer/heads
}
MATRIX = [
    {},
    {"pos_ffn_activation_fn": "gelu", "position_encoding_type": "SinusoidalConcat",
     "add_qkvbias": True, "add_ffnbias": True, "alignment_layer": 0, "alignment_heads": 1},
    {"share_decoder_embeddings": True, "layers": 3, "enc_layers": 3, "dec_layers": 3,
     "alignment_layer": -2, "alignment_heads": 2},
]  # fmt: skip


def onmt_align(model: Any, src: list[int], tgt_in: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """OpenNMT-py's log-probabilities (T, V) and its alignment attention (T, S), teacher-forced."""
    s = torch.tensor([src]).unsqueeze(-1)
    t = torch.tensor([tgt_in]).unsqueeze(-1)
    with torch.no_grad():
        enc_out, enc_final, src_len = model.encoder(s, torch.tensor([len(src)]))
        model.decoder.init_state(s, enc_out, enc_final)
        dec_out, attns = model.decoder(t, enc_out, src_len=src_len, with_align=True)
        log_probs = torch.log_softmax(model.generator(dec_out), -1)[0].numpy()
    return log_probs, attns["align"][0].numpy()


def our_steps(
    bundle: Path, src: list[int], tgt_in: list[int], vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """The bundle's graphs, one step a token: log-probabilities over our `vocab` ids (T, V), and
    the alignment (T, S)."""
    encoder = ort.InferenceSession(str(bundle / "encoder.onnx"))
    decoder = ort.InferenceSession(str(bundle / "decoder.onnx"))
    values, keys, mask, state = encoder.run(
        None, {"src": np.array([src]), "src_lengths": np.array([len(src)])}
    )
    caches = empty_caches(decoder, 1)
    names = [o.name for o in decoder.get_outputs()]
    rows, attention = [], []
    for t, token in enumerate(tgt_in):
        feed = {"tokens": np.array([token]), "state": state, "reorder": np.zeros(1, np.int64),
                "values": values, "keys": keys, "mask": mask, "k": np.array(vocab, np.int64),
                "positions": np.array([t]), **caches}  # fmt: skip
        got = dict(zip(names, decoder.run(None, feed), strict=True))
        row = np.full(vocab, -np.inf, np.float32)
        row[got["token_ids"][0]] = got["log_probs"][0]
        rows.append(row)
        attention.append(got["attention"][0])
        caches = {name[len("new_") :]: got[name] for name in names if name.startswith("new_self")}
        state = got["new_state"]
    return np.stack(rows), np.stack(attention)


@pytest.mark.parametrize(
    "changes", MATRIX, ids=["relu-interleaved", "gelu-concat-biases", "tied-3-layers"]
)
def test_each_step_and_the_alignment_are_opennmts(
    onmt_base: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    changes: dict[str, Any],
) -> None:
    """Teacher-forced on a source and a target of the checkpoint's vocabulary: every step's
    log-probabilities within 1e-5 of OpenNMT-py's generator, the alignment within 1e-5 of the
    attention it reports with -report_align (its alignment layer, its first alignment heads)."""
    ckpt = tmp_path / "model.pt"
    model, _ = onmt_checkpoint(ckpt, onmt_base, {**TRANSFORMER, **changes}, seed=3)
    bundle = opennmt.import_checkpoint(ckpt, tmp_path / "bundle", "t", "1")
    facts = opennmt.vocab_facts(opennmt.read_checkpoint(ckpt))
    src_order, tgt_order = facts["src_order"], facts["tgt_order"]
    src_ours, tgt_ours = [5, 9, 4, 12, 7, 2], [1, 8, 6, 11, 5]
    src_theirs = [src_order[i] for i in src_ours]
    tgt_theirs = [tgt_order[i] for i in tgt_ours]
    expected, align = onmt_align(model, src_theirs, tgt_theirs)
    got, attention = our_steps(bundle, src_ours, tgt_ours, len(tgt_order))
    np.testing.assert_allclose(got, expected[:, tgt_order], atol=1e-5)
    np.testing.assert_allclose(attention, align, atol=1e-5)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"max_relative_positions": 8, "position_encoding": False}, "-position_encoding False"),
        ({"full_context_alignment": True}, "-full_context_alignment True"),
        ({"self_attn_type": "average"}, "-self_attn_type 'average'"),
        ({"pos_ffn_activation_fn": "silu"}, "-pos_ffn_activation_fn 'silu'"),
    ],
)
def test_what_the_graphs_do_not_carry_is_refused_by_name(
    onmt_base: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    changes: dict[str, Any],
    words: str,
) -> None:
    ckpt = tmp_path / "model.pt"
    onmt_checkpoint(ckpt, onmt_base, {**TRANSFORMER, **changes}, seed=3)
    out = tmp_path / "bundle"
    with pytest.raises(ImportRefused, match=words.replace("(", r"\(")):
        opennmt.import_checkpoint(ckpt, out, "t", "1")
    assert not out.exists()


@pytest.mark.timeout(900)  # trains a Transformer (~20 s) and decodes 500 sentences four times
def test_translations_are_onmt_translates(task: Path, tmp_path: Path) -> None:  # noqa: F811
    """A 2 + 2 layer Transformer trained 300 steps by onmt_train, imported with s2s-import: the
    500 test sentences translated as onmt_translate translates them, greedy and at beam 5 (the
    bundle's OpenNMT-py beam rule)."""
    options = {
        **{k: v for k, v in TRANSFORMER.items() if k not in ("lambda_align",)},
        "dropout": [0.1],
        "attention_dropout": [0.1],
    }
    ckpt = toolkits.train_onmt(task, tmp_path / "onmt", options)
    bundle = tmp_path / "bundle"
    assert cli.main(["opennmt-py", "--checkpoint", str(ckpt), "--out", str(bundle)]) == 0
    sources = toolkits.read_lines(task / "test.src")
    engine = Engine.load(bundle)
    for beam in (1, 5):
        out = tmp_path / f"onmt{beam}.txt"
        theirs = toolkits.read_lines(toolkits.translate_onmt(ckpt, task / "test.src", out, beam))
        ours = toolkits.translate_lines(engine, sources, beam)
        assert ours == theirs, f"beam {beam}"
        assert len(set(theirs)) > 400  # the model translates, not one answer for all
