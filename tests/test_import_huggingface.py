"""s2s-import huggingface: a MarianMTModel directory → a bundle whose Transformer graphs compute
what transformers computes, step by step, and whose translations are generate()'s.

The model is made here (export/toolkits/hf_fixture.py: SentencePiece models trained on number
words, a 2 + 2 layer Marian trained a few hundred steps to copy its source), saved with
save_pretrained as the Hub's conversions are, and read back by transformers itself for the checks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from export.importers.common import ImportRefused  # noqa: E402
from export.importers.huggingface import import_model  # noqa: E402
from export.toolkits.hf_fixture import corpus, write_model  # noqa: E402
from service.decode.engine.engine import Engine  # noqa: E402
from service.decode.shared.config import RuntimeConfig  # noqa: E402
from service.decode.shared.options import SearchOptions  # noqa: E402
from service.decode.text.preparation import DecodeRequest  # noqa: E402
from service.decode.text.translation import Translation  # noqa: E402
from tests.conftest import empty_caches  # noqa: E402

TEXTS = corpus(24, seed=11)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("hf") / "marian", train_steps=800)


@pytest.fixture(scope="module")
def bundle(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_model(hf_dir, tmp_path_factory.mktemp("b") / "bundle", "tiny", "1")


def hf_model(hf_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(str(hf_dir), attn_implementation="eager").eval()
    return model, MarianTokenizer.from_pretrained(str(hf_dir))


def our_ids(bundle: Path, hf_dir: Path) -> dict[int, int]:
    """The toolkit's id → ours, through the two vocabularies' pieces."""
    ours = (bundle / "target.vocab").read_text(encoding="utf-8").splitlines()
    theirs = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
    index = {piece: i for i, piece in enumerate(ours)}
    return {hf_id: index[piece] for piece, hf_id in theirs.items()}


def test_each_step_computes_what_transformers_computes(hf_dir: Path, bundle: Path) -> None:
    """Teacher-forced on the same tokens, a batch of two sentences of different lengths: every
    step's log-probabilities within 1e-5 of MarianMTModel's log-softmax, the alignment (the last
    layer's cross-attention, heads averaged) within 1e-5 of output_attentions."""
    model, tokenizer = hf_model(hf_dir)
    mapping = our_ids(bundle, hf_dir)
    to_ours = np.vectorize(lambda i: mapping[int(i)])
    batch = tokenizer(TEXTS[:2], return_tensors="pt", padding=True)
    pad = model.config.pad_token_id
    targets = torch.tensor([[pad, 5, 6, 7, 8, 9, 10], [pad, 11, 9, 7, 5, 3, 2]])
    with torch.no_grad():
        out = model(**batch, decoder_input_ids=targets, output_attentions=True)
    expected = torch.log_softmax(out.logits, -1).numpy()
    cross = out.cross_attentions[-1].mean(1).numpy()  # (B, T, S)
    encoder = ort.InferenceSession(str(bundle / "encoder.onnx"))
    decoder = ort.InferenceSession(str(bundle / "decoder.onnx"))
    src = to_ours(batch["input_ids"].numpy()).astype(np.int64)
    lengths = batch["attention_mask"].sum(1).numpy().astype(np.int64)
    values, keys, mask, state = encoder.run(None, {"src": src, "src_lengths": lengths})
    caches = empty_caches(decoder, 2)
    names = [o.name for o in decoder.get_outputs()]
    vocab = len(mapping) + 1
    tokens = to_ours(targets.numpy()).astype(np.int64)
    worst_lp = worst_attention = 0.0
    for t in range(targets.shape[1]):
        feed = {"tokens": tokens[:, t], "state": state, "reorder": np.arange(2), "values": values,
                "keys": keys, "mask": mask, "k": np.array(vocab, np.int64),
                "positions": np.full(2, t, np.int64), **caches}  # fmt: skip
        got = dict(zip(names, decoder.run(None, feed), strict=True))
        log_probs = np.full((2, vocab), -np.inf, np.float32)
        np.put_along_axis(log_probs, got["token_ids"], got["log_probs"], 1)
        for hf_id, ours in mapping.items():
            if hf_id != pad:  # banned: -inf in both
                worst_lp = max(worst_lp, np.abs(log_probs[:, ours] - expected[:, t, hf_id]).max())
        assert np.all(np.isneginf(log_probs[:, mapping[pad]]))
        worst_attention = max(worst_attention, np.abs(got["attention"] - cross[:, t]).max())
        caches = {name[len("new_") :]: got[name] for name in names if name.startswith("new_self")}
        state = got["new_state"]
    assert worst_lp < 1e-5
    assert worst_attention < 1e-5


def load(bundle: Path, search: str) -> Engine:
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search=search)
    return Engine.load(bundle, config)


@pytest.mark.parametrize("search", ["host", "device"])
def test_sentences_joining_a_running_batch_get_what_they_get_alone(
    bundle: Path, search: str
) -> None:
    """A sentence that joins after others have decoded some steps reads a cache whose entries
    are left-padded to theirs (the fused kernel masks them by `positions`): its n-best list,
    scores and matrices are those it gets decoded alone."""
    engine = load(bundle, search)
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": 5, "n_best": 3})
    alone = {i: engine.translate([text], options, "subword")[0] for i, text in enumerate(TEXTS)}
    batch = engine.new_batch(5)
    pending = [DecodeRequest(i, engine.prepare(t), options, "subword") for i, t in enumerate(TEXTS)]
    got: dict[int, Translation] = {}
    while pending or len(batch):
        batch.add([pending.pop(0) for _ in range(min(len(pending), 2))])
        got.update(batch.step())
    assert got.keys() == alone.keys()
    for i, want in alone.items():
        for w, g in zip(want.hypotheses, got[i].hypotheses, strict=True):
            assert g.token_ids == w.token_ids, f"text {i}: {g.text!r} != {w.text!r}"
            assert abs(g.score - w.score) < 1e-5, f"text {i}: score {g.score} != {w.score}"
            assert g.alignment is not None and w.alignment is not None
            np.testing.assert_allclose(
                g.alignment.matrix, w.alignment.matrix, atol=1e-6, rtol=0, err_msg=f"text {i}"
            )


@pytest.mark.parametrize("beam", [1, 5])
def test_translations_are_generates(hf_dir: Path, bundle: Path, beam: int) -> None:
    """The best translation is MarianMTModel.generate's, greedy and at beam 5, for every text,
    with the bundle's decoding defaults (generate's rules: the "heuristic" stopping rule)."""
    model, tokenizer = hf_model(hf_dir)
    expected = []
    for text in TEXTS:
        with torch.no_grad():
            ids = model.generate(**tokenizer([text], return_tensors="pt"), num_beams=beam)
        expected.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    assert len(set(expected)) > len(TEXTS) // 2  # the fixture translates, not one string
    engine = load(bundle, "host")
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": beam, "n_best": 1})
    got = [r.hypotheses[0].text for r in engine.translate(TEXTS, options)]
    assert got == expected


def test_at_the_maximum_length_the_end_is_forced_as_generate_forces_it(
    hf_dir: Path, bundle: Path
) -> None:
    """With max_length 5 most hypotheses reach it: generate forces `</s>` as their last token
    (forced_eos_token_id, adding 0 to the score), and so does the bundle's default force_eos: the same n-best lists and
    sequences_scores. Without it the hypotheses are cut there, and the lists differ."""
    model, tokenizer = hf_model(hf_dir)
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=5, num_return_sequences=5, max_length=5,
                             output_scores=True, return_dict_in_generate=True)  # fmt: skip
    texts = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    scores = out.sequences_scores.tolist()
    engine = load(bundle, "host")
    assert engine.decoding_defaults["force_eos"] is True
    short = {**engine.decoding_defaults, "beam_size": 5, "n_best": 5, "max_length": 4,
             "max_length_b": 4}  # fmt: skip
    got = engine.translate(TEXTS, SearchOptions(**short))
    cut = engine.translate(TEXTS, SearchOptions(**{**short, "force_eos": False}))
    for i, translation in enumerate(got):
        assert [h.text for h in translation.hypotheses] == texts[i * 5 : (i + 1) * 5]
        ours = [h.score for h in translation.hypotheses]
        assert ours == pytest.approx(scores[i * 5 : (i + 1) * 5], abs=1e-5)
        assert all(h.finished for h in translation.hypotheses)
    assert any(not h.finished for t in cut for h in t.hypotheses)


@pytest.mark.parametrize("stopping", ["exact", "patience", "first"])
def test_the_device_search_answers_as_the_host_search(bundle: Path, stopping: str) -> None:
    """Every rule the device search takes (generate's own, "heuristic", stays on the host: its
    finished set is the beam's): the same n-best texts, scores and matrices on the Transformer,
    whose cache the device search carries between steps."""
    answers = []
    for search in ("host", "device"):
        engine = load(bundle, search)
        defaults = {**engine.decoding_defaults, "force_eos": False}  # a numpy-search control
        options = SearchOptions(**{**defaults, "beam_size": 5, "n_best": 2, "stopping": stopping})
        answers.append(engine.translate(TEXTS, options, "subword"))
    for host, device in zip(*answers, strict=True):
        assert [h.text for h in host.hypotheses] == [h.text for h in device.hypotheses]
        for a, b in zip(host.hypotheses, device.hypotheses, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-5)
            assert a.alignment is not None and b.alignment is not None
            np.testing.assert_allclose(a.alignment.matrix, b.alignment.matrix, atol=1e-5)


def test_an_answer_carries_the_cross_attention_as_its_alignment(bundle: Path) -> None:
    """Every n-best hypothesis comes with its own matrix: a row per target piece, each a
    distribution over the source's pieces (its `</s>` included)."""
    engine = load(bundle, "host")
    result = engine.translate([TEXTS[0]], SearchOptions(beam_size=5, n_best=2), "subword")[0]
    assert len(result.hypotheses) == 2
    for hypothesis in result.hypotheses:
        assert hypothesis.alignment is not None
        matrix = hypothesis.alignment.matrix
        assert matrix.shape == (len(hypothesis.tokens), len(result.source_tokens))
        np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-5)


def broken(hf_dir: Path, tmp_path: Path, edit: dict[str, object]) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(hf_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **edit}))
    return copy


@pytest.mark.parametrize(
    "edit, words",
    [
        ({"model_type": "bart"}, "model_type 'bart'"),
        ({"activation_function": "tanh"}, "activation_function 'tanh'"),
        ({"normalize_before": True}, "normalize_before"),
        ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"),
        ({"vocab_size": 999}, "vocab_size 999"),
        ({"d_model": 48}, "d_model 48"),
    ],
)
def test_what_the_graphs_do_not_carry_is_refused_naming_it(
    hf_dir: Path, tmp_path: Path, edit: dict[str, object], words: str
) -> None:
    source = broken(hf_dir, tmp_path, edit)
    out = tmp_path / "bundle"
    with pytest.raises(ImportRefused, match=words) as err:
        import_model(source, out, "x", "1")
    assert "config.json" in str(err.value) or str(source) in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize("missing", ["vocab.json", "model.safetensors", "source.spm"])
def test_a_missing_file_is_refused_naming_it(hf_dir: Path, tmp_path: Path, missing: str) -> None:
    copy = broken(hf_dir, tmp_path, {})
    (copy / missing).unlink()
    out = tmp_path / "bundle"
    with pytest.raises(ImportRefused) as err:
        import_model(copy, out, "x", "1")
    assert missing.split(".")[0] in str(err.value) or "pytorch_model.bin" in str(err.value)
    assert not out.exists()


def test_the_server_answers_with_a_matrix_per_hypothesis_and_aligns(bundle: Path) -> None:
    """Behind the gRPC server (one process): Translate returns each n-best hypothesis with its own
    matrix, and Align on the best translation gives back its log-probability and its matrix (the
    forced pass reads the same step)."""
    from proto.translation.v1 import translation_pb2 as pb
    from tests.test_server import ServerThread, base_args

    server = ServerThread.start(base_args(bundle))
    try:
        options = pb.DecodingOptions(beam_size=5, n_best=3, alignment=pb.ALIGNMENT_MODE_SUBWORD)
        reply = server.stub.Translate(pb.TranslateRequest(texts=TEXTS[:4], options=options))
        pairs = []
        for text, translation in zip(TEXTS[:4], reply.translations, strict=True):
            assert len(translation.hypotheses) == 3
            for hyp in translation.hypotheses:
                a = hyp.alignment
                matrix = np.array(a.weights).reshape(a.rows, a.cols)
                assert a.rows == len(hyp.tokens) and a.cols == len(translation.source_tokens)
                np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-5)
            pairs.append((text, translation.hypotheses[0]))
        aligned = server.stub.Align(
            pb.AlignRequest(
                pairs=[pb.AlignPair(source=s, target=h.text) for s, h in pairs],
                options=pb.AlignOptions(alignment=pb.ALIGNMENT_MODE_SUBWORD),
            )
        )
        for (_, best), got in zip(pairs, aligned.alignments, strict=True):
            assert list(got.target_tokens) == list(best.tokens)
            assert got.log_prob == pytest.approx(best.log_prob, abs=1e-4)
            np.testing.assert_allclose(
                np.array(got.subword.weights), np.array(best.alignment.weights), atol=1e-5
            )
    finally:
        server.close()


def test_align_by_any_layer_and_head_is_transformers_cross_attention(
    hf_dir: Path, bundle: Path
) -> None:
    """Align with AlignOptions.attention_layer/attention_head: every decoder layer's every head
    (and each layer's heads averaged) within 1e-5 of output_attentions on the same tokens. Layer
    0 attends through the fused kernel (its weights recomputed beside it), layer 1, the alignment
    layer, through plain ops."""
    from service.decode.align.aligner import align
    from service.decode.align.forced import AlignOptions

    model, tokenizer = hf_model(hf_dir)
    engine = load(bundle, "host")
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3])]
    shape = engine.bundle.architecture.transformer
    assert shape is not None and shape.dec_layers == 2 and shape.heads == 4
    for source, target in pairs:
        src = tokenizer([source], return_tensors="pt")
        labels = tokenizer(text_target=[target], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model(**src, labels=labels, output_attentions=True)
        for layer in range(shape.dec_layers):
            cross = out.cross_attentions[layer][0].numpy()  # (heads, T + 1, S): EOS's row last
            for head in [*range(shape.heads), None]:
                options = AlignOptions(
                    matrices="subword", attention_layer=layer, attention_head=head
                )
                got = align(engine, [(source, target)], options)[0]
                assert got.subword is not None
                assert len(got.target_tokens) == labels.shape[1] - 1  # its EOS not listed
                want = cross.mean(0) if head is None else cross[head]
                np.testing.assert_allclose(got.subword.matrix, want[:-1], atol=1e-5)
