"""s2s-import marian on a Marian Transformer (`--type transformer`, OPUS-MT's equations): the
bundle's n-best lists, scores and alignments are marian-decoder's own.

The model is trained here by Marian itself (pymarian, the `marian` extra): 2 + 2 post-norm layers
32 wide, 4 heads, swish, one SentencePiece vocabulary tied to everything, on the generated reversal
task, its alignment layer the first of the two (`--transformer-guided-alignment-layer 1`, so that
"the last layer" cannot pass by chance). Its special:model.yml ends in NUL bytes, as Marian 1.12
writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pymarian")
pytest.importorskip("torch")

from export.importers import cli, marian
from export.importers.marian_transformer import MAX_POSITIONS
from export.toolkits import marian_toolkit as mt
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.decode.text.translation import Translation

TESTS = 100
OPUS_DECODING = {"beam-size": 4, "normalize": 0.6, "word-penalty": 0}  # its decoder.yml's


class Trained:
    """The tiny Transformer, its vocabulary, its bundle and marian-decoder's n-best lists (soft
    alignments at beam 1 and 5, hard ones at beam 5)."""

    def __init__(self, root: Path) -> None:
        self.model = mt.train_demo(root, options=("--transformer-guided-alignment-layer", "1"),
                                   kind="transformer", n_test=TESTS, after="20e")  # fmt: skip
        task = root / "task"
        vocab = self.model.parent / "vocab.spm"
        self.vocabs = (vocab, vocab)
        self.source = task / "test.src"
        self.lines = self.source.read_text(encoding="utf-8").splitlines()
        self.bundle = marian.import_model(self.model, self.vocabs, root / "bundle", "mt", "1")
        self.nbest = {
            (beam, kind): mt.read_nbest(
                mt.decode(
                    self.model,
                    self.vocabs,
                    self.source,
                    root / f"b{beam}.{kind}",
                    beam,
                    n_best=True,
                    alignment=kind,
                )
            )
            for beam, kind in ((1, "soft"), (5, "soft"), (5, "hard"))
        }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return Trained(tmp_path_factory.mktemp("marian-transformer"))


def served(trained: Trained, beam: int, search: str = "host") -> list[Translation]:
    """The bundle as served with its decoding defaults (marian-decoder's rules), the whole beam's
    n-best list, subword alignments, in batches of 32."""
    engine = Engine.load(trained.bundle, RuntimeConfig(intra_op_threads=1, search=search))
    assert engine.decoding_defaults == {**marian.DECODING, "split_sentences": "on"}
    options = SearchOptions(beam_size=beam, n_best=beam, **engine.decoding_defaults)
    out: list[Translation] = []
    for i in range(0, len(trained.lines), 32):
        out += engine.translate(trained.lines[i : i + 32], options, alignment="subword")
    return out


@pytest.mark.parametrize("beam", [1, 5])
def test_nbest_scores_and_soft_alignments_are_marian_decoders(trained: Trained, beam: int) -> None:
    """Every n-best list is marian-decoder's (texts in order), scores within its printed
    precision (1e-4 or finer), each hypothesis's matrix within 1e-5 of `--alignment soft`."""
    for translation, theirs in zip(served(trained, beam), trained.nbest[beam, "soft"], strict=True):
        assert [h.text for h in translation.hypotheses] == [h.text for h in theirs]
        for hyp, their in zip(translation.hypotheses, theirs, strict=True):
            assert abs(hyp.score - their.score) <= mt.score_tolerance(their.score)
            assert hyp.alignment is not None
            weights = np.asarray(hyp.alignment.matrix)  # (T_y, T_x): tokens without `</s>`
            marian_rows = mt.soft_alignment(their.alignment)  # with `</s>`'s row
            assert weights.shape == (marian_rows.shape[0] - 1, marian_rows.shape[1])
            if weights.size:
                assert np.abs(weights - marian_rows[:-1]).max() < 1e-5


def test_hard_alignments_are_marian_decoders(trained: Trained) -> None:
    """`--alignment hard` at beam 5 against the served matrices' argmax: the same links for every
    hypothesis (its `</s>` row aside, which a served matrix does not carry)."""
    compared = 0
    for translation, theirs in zip(served(trained, 5), trained.nbest[5, "hard"], strict=True):
        for hyp, their in zip(translation.hypotheses, theirs, strict=True):
            assert hyp.alignment is not None
            rows = len(hyp.alignment.matrix)
            marian_links = {
                link for link in their.alignment.split() if int(link.split("-")[1]) < rows
            }
            assert mt.hard_links(np.asarray(hyp.alignment.matrix)) == marian_links
            compared += 1
    assert compared == 5 * TESTS


def test_device_search_answers_as_the_host_search(trained: Trained) -> None:
    host, device = served(trained, 5), served(trained, 5, search="device")
    for a, b in zip(host, device, strict=True):
        assert [h.text for h in a.hypotheses] == [h.text for h in b.hypotheses]
        assert np.allclose([h.score for h in a.hypotheses], [h.score for h in b.hypotheses],
                           atol=1e-5)  # fmt: skip


def test_the_bundle_says_what_it_imported(trained: Trained) -> None:
    manifest = json.loads((trained.bundle / "manifest.json").read_text())
    shape = manifest["architecture"]["transformer"]
    assert manifest["architecture"]["toolkit"] == "marian"
    assert (shape["align_layer"], shape["align_heads"]) == (0, [0])  # layer 1 (of 2), head 0
    assert (shape["positions"], shape["activation"], shape["norm_eps"]) == (
        "sinusoidal_marian", "swish", 1e-9,
    )  # fmt: skip
    assert manifest["info"]["marian_type"] == "transformer"
    assert MAX_POSITIONS >= 1024


def test_untied_embeddings_and_output_layer_decode_as_marian_decoder(tmp_path: Path) -> None:
    """A Transformer trained without tied embeddings (a source and a target table, `encoder_Wemb`
    and `decoder_Wemb`, and an output layer of its own, `decoder_ff_logit_out_Wt`) gives
    marian-decoder's n-best lists at beam 5, scores within its printed precision."""
    model = mt.train_demo(tmp_path, kind="transformer", n_test=30, after="3e", tied=False)
    weights = np.load(model)
    names = set(weights.files)
    assert {"encoder_Wemb", "decoder_Wemb", "decoder_ff_logit_out_Wt"} <= names, sorted(names)
    assert "Wemb" not in names
    vocab = model.parent / "vocab.spm"
    source = tmp_path / "task" / "test.src"
    bundle = marian.import_model(model, (vocab, vocab), tmp_path / "bundle", "untied", "1")
    theirs = mt.read_nbest(mt.decode(model, (vocab, vocab), source, tmp_path / "nbest", 5,
                                     n_best=True, alignment=""))  # fmt: skip
    engine = Engine.load(bundle, RuntimeConfig(intra_op_threads=1))
    options = SearchOptions(beam_size=5, n_best=5, **engine.decoding_defaults)
    ours = engine.translate(source.read_text(encoding="utf-8").splitlines(), options)
    assert len({t.hypotheses[0].text for t in ours}) > len(ours) // 2  # it translates
    for translation, their in zip(ours, theirs, strict=True):
        assert [h.text for h in translation.hypotheses] == [h.text for h in their]
        for hyp, one in zip(translation.hypotheses, their, strict=True):
            assert abs(hyp.score - one.score) <= mt.score_tolerance(one.score)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"transformer_decoder_autoreg": "rnn"}, "--transformer-decoder-autoreg 'rnn'"),
        ({"transformer_preprocess": "n"}, "--transformer-preprocess 'n'"),
        ({"transformer_postprocess_top": "n"}, "--transformer-postprocess-top 'n'"),
        ({"transformer_postprocess_emb": "dn"}, "--transformer-postprocess-emb 'dn'"),
        ({"transformer_ffn_activation": "gelu"}, "--transformer-ffn-activation 'gelu'"),
        ({"transformer_ffn_depth": 3}, "--transformer-ffn-depth 3"),
        ({"transformer_train_position_embeddings": True},
         "--transformer-train-position-embeddings True"),
        ({"transformer_tied_layers": [1, 1]}, "--transformer-tied-layers [1, 1]"),
        ({"transformer_attention_mask": "alibi"}, "--transformer-attention-mask 'alibi'"),
        ({"transformer_guided_alignment_layer": "3"}, "--transformer-guided-alignment-layer '3'"),
        ({"dec_depth": 3}, "decoder_l3_self_Wq"),
        ({"enc_depth": 1}, "encoder_l2_self_Wq"),
    ],
)  # fmt: skip
def test_refusals_name_the_option(
    trained: Trained,
    tmp_path: Path,
    changes: dict[str, object],
    named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = mt.rewrite_options(trained.model, tmp_path / "model.npz", changes)
    out = tmp_path / "bundle"
    argv = [
        "marian",
        "--model",
        str(model),
        "--vocabs",
        *map(str, trained.vocabs),
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


class Opus:
    """The same task in OPUS-MT's release layout (marian_toolkit.train_opus_demo): text segmented
    by source.spm/target.spm, one .yml vocabulary of pieces, a decoder.yml with beam-size 4 and
    normalize 0.6; imported from the decoder.yml alone."""

    def __init__(self, root: Path) -> None:
        self.config = mt.train_opus_demo(root, OPUS_DECODING, n_test=TESTS)
        folder = self.config.parent
        self.bundle = root / "bundle"
        argv = ["marian", "--config", str(self.config), "--out", str(self.bundle)]
        assert cli.main(argv) == 0
        task = root / "task"
        self.lines = (task / "test.src").read_text(encoding="utf-8").splitlines()
        vocab = folder / "vocab.yml"
        nbest = mt.decode(folder / "model.npz", (vocab, vocab), task / "test.src.sp",
                          root / "opus.nbest", 4, n_best=True, extra=("--normalize", "0.6"))  # fmt: skip
        self.nbest = mt.read_nbest(nbest)
        import sentencepiece as spm

        self.target_spm = spm.SentencePieceProcessor(model_file=str(folder / "target.spm"))


@pytest.fixture(scope="module")
def opus(tmp_path_factory: pytest.TempPathFactory) -> Opus:
    return Opus(tmp_path_factory.mktemp("opus-layout"))


def test_opus_mt_layout_serves_raw_text_as_marian_decodes_segmented_text(opus: Opus) -> None:
    """Imported from its decoder.yml: the bundle's defaults are its beam-size and normalize, the
    segmenters beside it cut the raw text; each served n-best list is marian-decoder's on the
    segmented text (its pieces joined by target.spm), scores within its printed precision."""
    engine = Engine.load(opus.bundle, RuntimeConfig(intra_op_threads=1))
    assert engine.decoding_defaults == {
        **marian.DECODING,
        "beam_size": 4,
        "normalize": 0.6,
        "split_sentences": "on",
    }
    manifest = json.loads((opus.bundle / "manifest.json").read_text())
    assert manifest["info"]["segmenters"] == ["source.spm", "target.spm"]
    options = SearchOptions(**{**engine.decoding_defaults, "n_best": 4})
    got = engine.translate(opus.lines, options, alignment="none")
    for translation, theirs in zip(got, opus.nbest, strict=True):
        texts = [opus.target_spm.decode_pieces(h.text.split()) for h in theirs]
        assert [h.text for h in translation.hypotheses] == texts
        for hyp, their in zip(translation.hypotheses, theirs, strict=True):
            assert abs(hyp.score - their.score) <= mt.score_tolerance(their.score)


def test_decoder_config_refusals(
    opus: Opus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    config = yaml.safe_load(opus.config.read_text())
    for change, named in (({"allow-unk": True}, "allow-unk True"),
                          ({"models": ["a.npz", "b.npz"]}, "an ensemble")):  # fmt: skip
        path = opus.config.parent / "changed.yml"
        path.write_text(yaml.safe_dump({**config, **change}))
        argv = ["marian", "--config", str(path), "--out", str(tmp_path / "b")]
        assert cli.main(argv) == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
