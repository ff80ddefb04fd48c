"""s2s-import marian against Marian itself: pymarian trains tiny s2s models on a generated task
(seconds), we import them, and their decodes, n-best scores and soft alignments must equal
marian-decoder's. Skipped where pymarian (the `marian` extra) is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("pymarian")

from export.importers import cli, marian
from export.toolkits import marian_toolkit as mt
from export.toolkits.marian_search import MarianRules, MarianSearch
from service.decode.align.aligner import align
from service.decode.engine.engine import Engine
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig

SCORE_TOLERANCE = 1e-4


class Trained:
    """A tiny Marian model, its vocabularies, its bundle and Marian's own n-best lists."""

    def __init__(
        self, root: Path, vocab_kind: str, options: tuple[str, ...], words: bool = False
    ) -> None:
        self.model = (
            mt.train_words_demo(root, options)
            if words
            else mt.train_demo(root, vocab_kind, options)
        )
        self.vocabs = (
            self.model.parent / f"src.{vocab_kind}",
            self.model.parent / f"tgt.{vocab_kind}",
        )
        self.source = root / "task" / "test.src"
        self.lines = self.source.read_text(encoding="utf-8").splitlines()
        self.bundle = marian.import_model(
            self.model, self.vocabs, root / "bundle", "tiny-marian", "1.0.0", int8=True
        )
        self.nbest = {
            beam: mt.read_nbest(
                mt.decode(
                    self.model,
                    self.vocabs,
                    self.source,
                    root / f"marian.b{beam}.nbest",
                    beam,
                    n_best=True,
                    alignment="soft",
                )
            )
            for beam in (1, 5)
        }


@pytest.fixture(scope="session")
def s2s(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Marian's default s2s (bi-GRU, cGRU, MLP attention, deep output) with SentencePiece."""
    return Trained(tmp_path_factory.mktemp("marian-s2s"), "spm", ())


@pytest.fixture(scope="session")
def lstm(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The second shape: LSTM cells in the encoder and both decoder cells, .yml word vocabularies,
    and the output layer tied to the target embedding."""
    options = ("--enc-cell", "lstm", "--dec-cell", "lstm", "--tied-embeddings")
    return Trained(tmp_path_factory.mktemp("marian-lstm"), "yml", options)


@pytest.fixture(scope="session")
def words(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Ordinary words: .yml vocabularies with the words YAML 1.1 reads as booleans and numbers
    (on, no, yes, 1984, ...), written unquoted by Marian, and --dim-vocabs above the corpus's
    types (embeddings and output layer wider than the vocabularies); tied output, as a user's."""
    root = tmp_path_factory.mktemp("marian-words")
    return Trained(root, "yml", ("--tied-embeddings",), words=True)


def mismatches(trained: Trained, beam: int) -> list[str]:
    """Sentences whose n-best list (texts, order, scores, soft alignments) under Marian's search
    rule over our graphs differs from marian-decoder's."""
    search = MarianSearch(trained.bundle)
    bad = []
    for line, theirs in zip(trained.lines, trained.nbest[beam], strict=True):
        ours = search.translate(line, MarianRules(beam_size=beam))
        same = [h.text for h in ours] == [h.text for h in theirs] and all(
            abs(a.score - b.score) <= mt.score_tolerance(b.score, SCORE_TOLERANCE)
            and np.abs(a.attention - mt.soft_alignment(b.alignment)).max() < 1e-5
            for a, b in zip(ours, theirs, strict=True)
        )
        if not same:
            bad.append(
                f"{line!r}: ours {[h.text for h in ours]} Marian's {[h.text for h in theirs]}"
            )
    return bad


@pytest.mark.parametrize("beam", [1, 5])
def test_s2s_nbest_equals_marian(s2s: Trained, beam: int) -> None:
    assert len(s2s.lines) == 60
    assert mismatches(s2s, beam) == []


@pytest.mark.parametrize("beam", [1, 5])
def test_lstm_tied_yml_nbest_equals_marian(lstm: Trained, beam: int) -> None:
    assert mismatches(lstm, beam) == []


def test_yaml_words_and_a_vocabulary_narrower_than_the_embeddings_import_exactly(
    words: Trained,
) -> None:
    """Marian reads every .yml key as text and keeps --dim-vocabs rows: so does the importer (the
    rows past the vocabulary are never emitted), and the n-best lists are marian-decoder's."""
    vocab = (words.model.parent / "tgt.yml").read_text(encoding="utf-8")
    assert "\non: " in vocab and "\nno: " in vocab and "\n1984: " in vocab  # unquoted
    with np.load(words.model) as npz:
        assert npz["decoder_Wemb"].shape[0] == 64
    tokens = marian.read_vocab(words.vocabs[1], "target").tokens
    assert len(tokens) < 64 and set(mt.YAML_WORDS) <= set(tokens)
    for beam in (1, 5):
        assert mismatches(words, beam) == []
    engine = Engine.load(words.bundle, RuntimeConfig(intra_op_threads=1))
    got = engine.translate(words.lines, SearchOptions(beam_size=5, n_best=5), "none")
    known = set(tokens) - {"</s>", "<unk>"}
    assert all(set(h.text.split()) <= known for t in got for h in t.hypotheses)
    # what the words mean to YAML is lost nowhere: "on" is the token "on", not True, both ways
    # (read and written back; whatever the model, trained here for two epochs, would answer)
    (pair,) = align(engine, [("on no 1984", "1984 no on")])
    assert pair.target_tokens == ["1984", "no", "on"] and pair.unknown_target_tokens == []
    as_prefix = SearchOptions(beam_size=1, max_length=3, target_prefix=("1984 no on",))
    (t,) = engine.translate(["on no 1984"], as_prefix, "none")
    assert t.hypotheses[0].text == "1984 no on"


def served_options(engine: Engine, beam: int) -> SearchOptions:
    """marian-decoder's rules as served options: the bundle's defaults (its length rule, the beam
    narrowing for good) and the n-best list of the whole beam."""
    return SearchOptions(beam_size=beam, n_best=beam, **engine.decoding_defaults)


@pytest.mark.parametrize("beam", [1, 5])
def test_served_nbest_equals_marian(s2s: Trained, beam: int) -> None:
    """The engine as served, with the bundle's defaults: every n-best list is marian-decoder's
    (texts, order, scores), and each hypothesis's attention matrix is its soft alignment."""
    engine = Engine.load(s2s.bundle, RuntimeConfig(intra_op_threads=1))
    assert engine.decoding_defaults == marian.DECODING
    ours = engine.translate(s2s.lines, served_options(engine, beam), alignment="subword")
    for translation, theirs in zip(ours, s2s.nbest[beam], strict=True):
        assert [h.text for h in translation.hypotheses] == [h.text for h in theirs]
        for hyp, their in zip(translation.hypotheses, theirs, strict=True):
            assert abs(hyp.score - their.score) <= mt.score_tolerance(their.score)
            assert hyp.alignment is not None
            weights = np.asarray(hyp.alignment.matrix)  # (T_y, T_x)
            marian_rows = mt.soft_alignment(their.alignment)
            assert weights.shape[1] == marian_rows.shape[1]  # source pieces with `</s>`
            assert np.abs(weights - marian_rows[: weights.shape[0]]).max() < 1e-5


@pytest.mark.parametrize("shape", ["s2s", "lstm"])
def test_the_bundle_says_it_is_marians(shape: str, request: pytest.FixtureRequest) -> None:
    """The manifest names what the model is: toolkit marian, the conditional decoder (cgru),
    for the architecture and the tokenizer; serving reads them (ModelInfo, the beam's rule)."""
    trained: Trained = request.getfixturevalue(shape)
    manifest = json.loads((trained.bundle / "manifest.json").read_text())
    architecture = manifest["architecture"]
    assert (architecture["toolkit"], architecture["decoder_style"]) == ("marian", "cgru")
    assert manifest["tokenizer"]["toolkit"] == "marian"
    assert "serving_labels" not in manifest["info"]
    engine = Engine.load(trained.bundle, RuntimeConfig(intra_op_threads=1))
    assert (engine.cfg.toolkit, engine.cfg.conditional) == ("marian", True)


def test_int8_bundle_decodes(s2s: Trained) -> None:
    search = MarianSearch(s2s.bundle, int8=True)
    outputs = [search.translate(line, MarianRules(beam_size=5))[0].text for line in s2s.lines]
    marian_best = [theirs[0].text for theirs in s2s.nbest[5]]
    agree = sum(a == b for a, b in zip(outputs, marian_best, strict=True))
    assert agree >= len(outputs) // 2  # int8 weights: close to, not equal to, Marian's fp32


def rewritten(trained: Trained, tmp_path: Path, **changes: object) -> Path:
    """A copy of the model whose special:model.yml has `changes` (option names with - as _)."""
    return mt.rewrite_options(trained.model, tmp_path / "model.npz", changes)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"type": "amun"}, "--type 'amun'"),
        ({"enc_type": "alternating"}, "--enc-type 'alternating'"),
        ({"enc_depth": 2}, "--enc-depth 2"),
        ({"dec_depth": 2}, "--dec-depth 2"),
        ({"dec_cell_base_depth": 3}, "--dec-cell-base-depth 3"),
        ({"dec_cell": "mgru"}, "--dec-cell 'mgru'"),
        ({"skip": True}, "--skip True"),
        ({"layer_normalization": True}, "--layer-normalization True"),
        ({"right_left": True}, "--right-left True"),
        ({"original_type": "nematus"}, "--type 'nematus'"),
    ],
)
def test_refusals_name_the_option(
    s2s: Trained,
    tmp_path: Path,
    changes: dict[str, object],
    named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = rewritten(s2s, tmp_path, **changes)
    out = tmp_path / "bundle"
    argv = ["marian", "--model", str(model), "--vocabs", *map(str, s2s.vocabs), "--out", str(out)]
    assert cli.main(argv) == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


def test_refuses_vocabularies_of_the_wrong_size(
    s2s: Trained, lstm: Trained, tmp_path: Path
) -> None:
    with pytest.raises(marian.ImportRefused, match="vocabulary size mismatch"):
        marian.import_model(s2s.model, lstm.vocabs, tmp_path / "bundle", "x", "1")
    with pytest.raises(marian.ImportRefused, match=r"not a Marian model\.npz"):
        bad = tmp_path / "bad.npz"
        bad.write_text("not a model")
        marian.import_model(bad, s2s.vocabs, tmp_path / "bundle", "x", "1")
    assert not (tmp_path / "bundle").exists()


def test_server_answers_as_marian(s2s: Trained) -> None:
    """Through the gRPC server, a request naming only the beam and the n-best size gets the
    bundle's defaults (Marian's rules) and marian-decoder's n-best lists."""
    from proto.translation.v1 import translation_pb2 as pb
    from tests.test_server import ServerThread, base_args, matrix

    texts = s2s.lines[:12]
    options = pb.DecodingOptions(beam_size=5, n_best=5, alignment=pb.ALIGNMENT_MODE_SUBWORD)
    server = ServerThread.start(base_args(s2s.bundle))
    try:
        response = server.stub.Translate(pb.TranslateRequest(texts=texts, options=options))
        info = server.stub.GetModelInfo(pb.ModelInfoRequest())
    finally:
        server.close()
    compared = 0
    for translation, theirs in zip(response.translations, s2s.nbest[5][:12], strict=True):
        assert [h.text for h in translation.hypotheses] == [h.text for h in theirs]
        for hyp, their in zip(translation.hypotheses, theirs, strict=True):
            assert abs(hyp.score - their.score) <= mt.score_tolerance(their.score)
            # Marian's rows: one per target piece, and one for `</s>` where the hypothesis ended
            marian_rows = mt.soft_alignment(their.alignment)
            ours = matrix(hyp.alignment)  # (target pieces, source pieces with `</s>`)
            assert ours.shape[0] in (marian_rows.shape[0] - 1, marian_rows.shape[0])
            assert np.abs(ours - marian_rows[: ours.shape[0]]).max() < 1e-5
            compared += 1
    assert compared == 60
    architecture = json.loads(info.architecture_json)
    assert (architecture["toolkit"], architecture["decoder_style"]) == ("marian", "cgru")
