"""The link head (service/decode/runtime/link_head.py, export/link_head.py): Align's supervised word aligner.

Hand-worked lexicon features and link rule; the graph equal to the module for pairs of different
lengths (padding must not leak into a batch's shorter pairs); a toy corpus trained through
s2s-train with a [link_head] table gets a head that the server loads and uses by default, whose
links stay inside each pair and do not depend on the batch; a model without a head refuses links
"head" naming the model; a manifest that names a head it does not have is refused at load.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from export import link_head as link_head_cli
from export import pipeline
from export.onnx.link_head import example_inputs, export_link_head, parity_error
from export.onnx.to_onnx import export_bundle
from export.train.link_head import (
    Example,
    LinkHeadConfig,
    LinkHeadEnsemble,
    LinkHeadNet,
    distil_loss,
    link_loss,
    make_batch,
    predict,
    span_loss,
)
from proto.translation.v1 import translation_pb2 as pb
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.projection import head_weights
from service.decode.engine.engine import Engine
from service.decode.runtime.lexicon import NUM_FEATURES, Lexicon, normalize
from service.decode.runtime.link_head import head_links
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.errors import InvalidInput
from service.model.bundle import BundleError, load_bundle
from service.serve.config import load_settings
from service.serve.protocol import default_link_mode, parse_align_request
from tests.conftest import REPO, TinyModel
from tests.test_parallel_corpus import toy_config

CPU = RuntimeConfig(providers=("CPUExecutionProvider",))


# --- lexicon features and the link rule, by hand ---------------------------------------------------


def test_normalize_drops_case_accents_and_punctuation() -> None:
    assert normalize("Θεοῦ,") == "θεου"
    assert normalize("Ὁ") == "ο"
    assert normalize("Word.") == "word"
    assert normalize("—") == "—"  # punctuation alone stays a word


def test_lexicon_features_are_link_count_ratios() -> None:
    lexicon = Lexicon.from_links(
        [
            (["Ὁ", "λόγος"], ["The", "Word"], [(0, 0), (1, 1)]),
            (["λόγος,"], ["word"], [(0, 0)]),
            (["λόγῳ"], ["said"], []),
        ],
        stem=3,
    )
    f = lexicon.features(["λόγος", "λόγῳ"], ["Word", "said"])  # (T=2, S=2, F)
    assert f.shape == (2, 2, NUM_FEATURES)
    # positions: target t/T minus source s/S, and its magnitude
    assert np.allclose(f[..., 0], [[0.0, -0.5], [0.5, 0.0]])
    assert np.allclose(f[..., 1], np.abs(f[..., 0]))
    # forms: "λογος"-"word" linked twice; λογος seen twice, word twice → P(t|s) = P(s|t) = 1
    assert f[0, 0, 2] == pytest.approx(1.0) and f[0, 0, 3] == pytest.approx(1.0)
    assert f[1, 1, 2] == 0.0  # λογω and said were seen but never linked
    # stems of 3: "λογ" (λογος x2, λογω x1) - "wor" linked twice: P(t|s) = 2/3, P(s|t) = 2/2
    assert f[0, 0, 4] == pytest.approx(2 / 3) and f[0, 0, 5] == pytest.approx(1.0)
    assert f[0, 1, 4] == pytest.approx(2 / 3)  # λόγῳ shares the stem
    # frequencies, capped at 50: λογος 2, λογω 1; word 2, said 1
    assert np.allclose(f[0, :, 6], [2 / 50, 1 / 50]) and np.allclose(f[:, 0, 7], [2 / 50, 1 / 50])


def test_lexicon_conditionals_are_one_lookup_per_cell() -> None:
    """The cells looked up at once equal a dictionary lookup per cell, for repeated and unknown
    words, before and after more counts come in (the lookup table is rebuilt)."""
    rng = random.Random(0)
    src_vocab, tgt_vocab = [f"σ{i}" for i in range(12)], [f"w{i}" for i in range(9)]
    counts = Lexicon.from_links([]).forms
    for _ in range(2):
        for _ in range(30):
            src = rng.choices(src_vocab, k=rng.randint(1, 6))
            tgt = rng.choices(tgt_vocab, k=rng.randint(1, 6))
            pairs = [(i, j) for i in range(len(src)) for j in range(len(tgt))]
            counts.update(src, tgt, [p for p in pairs if rng.random() < 0.3])
        src = [*rng.choices(src_vocab, k=7), "unknown"]
        tgt = [*rng.choices(tgt_vocab, k=5), "unseen"]
        given_src, given_tgt = counts.conditionals(src, tgt)  # (T, S)
        for t, e in enumerate(tgt):
            for s, g in enumerate(src):
                c = counts.pairs.get((g, e), 0)
                assert given_src[t, s] == np.float32(c / counts.source[g] if c else 0.0)
                assert given_tgt[t, s] == np.float32(c / counts.target[e] if c else 0.0)
        assert given_src.any() and not given_src[:, -1].any() and not given_tgt[-1].any()
    empty = Lexicon.from_links([]).forms.conditionals(["a"], ["b", "c"])
    assert [x.shape for x in empty] == [(2, 1), (2, 1)] and not empty[0].any()


def test_lexicon_survives_save_and_load(tmp_path: Path) -> None:
    lexicon = Lexicon.from_links([(["Ὁ", "λόγος"], ["The", "Word"], [(0, 0), (1, 1)])])
    lexicon.save(tmp_path / "lex.json")
    again = Lexicon.load(tmp_path / "lex.json")
    words = (["λόγος", "ὁ"], ["the", "word", "x"])
    assert np.array_equal(again.features(*words), lexicon.features(*words))
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match=r"bad\.json is not a link lexicon"):
        Lexicon.load(tmp_path / "bad.json")


def test_head_links_rule() -> None:
    logits = np.array([[2.0, -1.0], [-3.0, -2.5], [1.0, 3.0]])  # (T=3, S=2)
    # row 0's best (0) has sigmoid 0.88; row 1's best (1) 0.08; row 2's best (1) 0.95, its other 0.73
    assert head_links(logits, 0.0, 1.0) == {(0, 0), (1, 1), (1, 2)}  # every row's argmax
    assert head_links(logits, 0.3, 1.0) == {(0, 0), (1, 2)}  # row 1 too unsure: no link
    assert head_links(logits, 0.3, 0.7) == {(0, 0), (1, 2), (0, 2)}  # a second link for row 2
    assert head_links(np.zeros((0, 3)), 0.0, 0.5) == set()


# --- the graph is the module ---------------------------------------------------------------------


def random_example(rng: np.random.Generator, S_w: int, T_w: int) -> Example:
    src_word_of = np.repeat(np.arange(S_w), rng.integers(1, 3, S_w))
    tgt_word_of = np.repeat(np.arange(T_w), rng.integers(1, 3, T_w))
    return Example(
        states=rng.normal(size=(S_w, 12)).astype(np.float32),
        src_ids=rng.integers(4, 30, len(src_word_of)),
        src_word_of=src_word_of,
        tgt_ids=rng.integers(4, 30, len(tgt_word_of)),
        tgt_word_of=tgt_word_of,
        features=rng.random((T_w, S_w, NUM_FEATURES)).astype(np.float32),
        gold=[],
        src_words=[],
        tgt_words=[],
    )


@pytest.mark.parametrize("passes", [1, 2])
def test_graph_equals_the_module_for_pairs_of_different_lengths(
    tmp_path: Path, passes: int
) -> None:
    """The module scores padded batches; the graph one pair at a time: the same logits (the
    second pass's softmaxes must not read the padding either)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    examples = [random_example(rng, s, t) for s, t in ((7, 9), (2, 3), (5, 1), (1, 6))]
    cfg = LinkHeadConfig(emb_dim=8, hidden=8, attn_dim=8, refine_channels=4, passes=passes)
    net = LinkHeadNet(cfg, state_dim=12, src_vocab=30, tgt_vocab=30).eval()
    path = export_link_head(net, examples[0], tmp_path / "head.onnx")
    assert parity_error(net, path, examples) < 1e-5
    batched = predict(net, examples)
    with torch.no_grad():
        for example, logits in zip(examples, batched, strict=True):
            alone = net(*(torch.from_numpy(a) for a in example_inputs(example).values()))[0]
            assert logits.shape == example.shape
            assert np.allclose(alone.numpy(), logits, atol=1e-5)


def test_an_ensemble_graph_is_the_mean_of_its_members(tmp_path: Path) -> None:
    """Members' scores averaged in one graph with the one-head contract, padded or not."""
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    examples = [random_example(rng, s, t) for s, t in ((4, 6), (2, 2), (6, 3))]
    cfg = LinkHeadConfig(emb_dim=8, hidden=8, attn_dim=8, refine_channels=4, passes=2)
    members = [LinkHeadNet(cfg, state_dim=12, src_vocab=30, tgt_vocab=30).eval() for _ in "ab"]
    ensemble = LinkHeadEnsemble(members).eval()
    path = export_link_head(ensemble, examples[0], tmp_path / "head.onnx")
    assert parity_error(ensemble, path, examples) < 1e-5
    alone = [predict(m, examples) for m in members]
    for i, logits in enumerate(predict(ensemble, examples)):
        assert np.allclose(logits, (alone[0][i] + alone[1][i]) / 2, atol=1e-6)
        assert not np.allclose(alone[0][i], alone[1][i])  # two different heads


def test_span_loss_asks_whether_a_word_is_mostly_inside_each_span() -> None:
    """By hand, one pair of 2 target × 3 source words whose scores put target word 0 on source
    word 0 and target word 1 on source word 2: the projection weights are then near one-hot,
    so the loss is small against those links and large against links that disagree with them;
    padding (a second, shorter pair) changes nothing."""
    logits = torch.tensor([[[9.0, -9.0, -9.0], [-9.0, -9.0, 9.0]]])  # (1, T=2, S=3)
    valid = torch.ones(1, 2, 3, dtype=torch.bool)
    agree = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    disagree = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    low = float(span_loss(logits, agree, valid))
    high = float(span_loss(logits, disagree, valid))
    assert low < 0.01 < 5.0 < high
    # an unlinked target word is not asked about
    half = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    assert float(span_loss(logits, half, valid)) < 0.01
    padded = torch.cat([logits, torch.zeros(1, 2, 3)])  # (2, 2, 3): pair 2 is 1 × 1
    pad_valid = torch.zeros(2, 2, 3, dtype=torch.bool)
    pad_valid[0], pad_valid[1, 0, 0] = True, True
    pad_gold = torch.cat([agree, torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])])
    assert float(span_loss(padded, pad_gold, pad_valid)) < 0.01


def test_span_loss_trains_the_weights_toward_the_spans() -> None:
    """A few gradient steps on free logits against links that one target word shares between two
    source words lower the span loss and leave that word more than half inside both 1-word spans'
    union, as the projection reads it."""
    torch.manual_seed(0)
    logits = torch.zeros(1, 3, 4, requires_grad=True)
    gold = torch.zeros(1, 3, 4)
    gold[0, 0, 0] = gold[0, 1, 1] = gold[0, 1, 2] = gold[0, 2, 3] = 1.0
    valid = torch.ones(1, 3, 4, dtype=torch.bool)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    before = float(span_loss(logits.detach(), gold, valid))
    for _ in range(200):
        optimizer.zero_grad()
        loss = link_loss(logits, gold, valid, span_weight=2.0)
        loss.backward()
        optimizer.step()
    assert float(span_loss(logits.detach(), gold, valid)) < before / 4
    weights = head_weights(logits.detach()[0].numpy())
    assert weights[1, 1:3].sum() > 0.5 and weights[1, 0] < 0.5 and weights[1, 3] < 0.5


def test_distil_loss_is_zero_at_the_teacher_and_ignores_padding() -> None:
    """0 where the scores are the teacher's, more the further they are, in every reading (a
    changed cell moves the sigmoid, the row and the column terms); a padded batch's extra cells
    change nothing."""
    torch.manual_seed(0)
    teacher = torch.randn(1, 3, 4) * 3  # (B=1, T=3, S=4)
    inside = torch.ones(1, 3, 4, dtype=torch.bool)
    assert float(distil_loss(teacher, teacher, inside)) == pytest.approx(0.0, abs=1e-6)
    near, far = teacher.clone(), teacher.clone()
    near[0, 1, 2] += 0.5
    far[0, 1, 2] += 3.0
    assert 0 < float(distil_loss(near, teacher, inside)) < float(distil_loss(far, teacher, inside))
    shifted = teacher + 2.0  # the same softmaxes, other sigmoids: the cells' term alone
    assert float(distil_loss(shifted, teacher, inside)) > 0.1
    padded = torch.cat([teacher, torch.randn(1, 3, 4) * 5], -1)  # (1, 3, 8): 4 padded columns
    pad_inside = torch.cat([inside, torch.zeros(1, 3, 4, dtype=torch.bool)], -1)
    pad_teacher = torch.cat([teacher, torch.randn(1, 3, 4)], -1)
    assert float(distil_loss(padded, pad_teacher, pad_inside)) == pytest.approx(0.0, abs=1e-6)


def test_distil_loss_trains_the_scores_toward_the_teacher() -> None:
    """Gradient steps on free scores from zero reach the teacher's links, softmaxes and
    projection weights (what Align and markup read)."""
    torch.manual_seed(0)
    teacher = torch.randn(2, 5, 6) * 3  # (B, T, S)
    inside = torch.ones(2, 5, 6, dtype=torch.bool)
    inside[1, 3:], inside[1, :, 4:] = False, False  # pair 2 is 3 x 4
    logits = torch.zeros(2, 5, 6, requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    before = float(distil_loss(logits.detach(), teacher, inside))
    for _ in range(300):
        optimizer.zero_grad()
        distil_loss(logits, teacher, inside).backward()
        optimizer.step()
    assert float(distil_loss(logits.detach(), teacher, inside)) < before / 100
    for b, (T, S) in enumerate(((5, 6), (3, 4))):
        ours, theirs = logits.detach()[b, :T, :S].numpy(), teacher[b, :T, :S].numpy()
        assert np.array_equal(ours.argmax(1), theirs.argmax(1))
        assert np.allclose(head_weights(ours), head_weights(theirs), atol=0.02)
        assert np.array_equal(ours > 0, theirs > 0)


def test_a_batch_carries_the_teachers_scores_padded() -> None:
    rng = np.random.default_rng(2)
    examples = [random_example(rng, s, t) for s, t in ((3, 2), (1, 4))]
    assert make_batch(examples).soft is None
    soft = [rng.normal(size=e.shape).astype(np.float32) for e in examples]
    for e, logits in zip(examples, soft, strict=True):
        e.soft = logits
    batch = make_batch(examples)
    assert batch.soft is not None and batch.soft.shape == (2, 4, 3)
    assert np.array_equal(batch.soft[1, :4, :1].numpy(), soft[1])
    assert float(batch.soft[1, :, 1:].abs().sum()) == 0.0
    assert batch.inside.sum() == 2 * 3 + 4 * 1


def test_the_greek_bundle_ships_one_small_head() -> None:
    """grc-en-nt's head is one head distilled from the two-member ensemble it replaced (34.6 MB,
    four times the computation of the one before it), within the old head's size."""
    bundle = REPO / "models" / "grc-en-nt"
    assert (bundle / "link_head.onnx").stat().st_size <= 10_000_000
    info = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))["info"]["link_head"]
    assert info["members"] == 1 and info["distil"] > 0 and info["teacher"]["members"] == 2


def test_config_refuses_bad_passes_span_loss_and_members() -> None:
    with pytest.raises(ValueError, match="passes must be 1 or 2"):
        LinkHeadConfig.from_dict({"passes": 3})
    with pytest.raises(ValueError, match="span_loss must be >= 0"):
        LinkHeadConfig.from_dict({"span_loss": -1.0})
    with pytest.raises(ValueError, match="members and workers must be >= 1"):
        LinkHeadConfig.from_dict({"members": 0})


def test_config_reads_a_teacher_table_and_refuses_half_a_distillation() -> None:
    cfg = LinkHeadConfig.from_dict(
        {"hidden": 64, "distil": 1.0, "teacher": {"members": 2, "passes": 2}}
    )
    assert cfg.teacher == LinkHeadConfig(members=2, passes=2)
    with pytest.raises(ValueError, match=r"distil > 0 needs a \[link_head.teacher\] table"):
        LinkHeadConfig.from_dict({"distil": 1.0})
    with pytest.raises(ValueError, match="a teacher needs distil > 0"):
        LinkHeadConfig.from_dict({"teacher": {"members": 2}})
    with pytest.raises(ValueError, match="cannot have a teacher of its own"):
        LinkHeadConfig.from_dict(
            {"distil": 1.0, "teacher": {"distil": 1.0, "teacher": {"members": 2}}}
        )
    with pytest.raises(ValueError, match=r"unknown keys \['hiden'\]"):
        LinkHeadConfig.from_dict({"distil": 1.0, "teacher": {"hiden": 3}})


# --- trained through s2s-train, served -------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy-head")
    config = toy_config(folder, steps=120)
    config.write_text(
        config.read_text()
        + "\n[link_head]\nepochs = 6\nhidden = 16\npasses = 2\nspan_loss = 2.0\ndistil = 1.0\n"
        + "\n[link_head.teacher]\nepochs = 6\nhidden = 32\npasses = 2\nspan_loss = 2.0\n"
        + "members = 2\nworkers = 2\n"
    )
    assert pipeline.main(["--config", str(config), "--out", str(folder / "run")]) == 0
    return folder / "run"


def toy_pairs(run: Path, split: str) -> list[tuple[str, str]]:
    rows = [line.split("\t") for line in (run / "data" / f"{split}.tsv").read_text().splitlines()]
    return [(row[0], row[1]) for row in rows]


@pytest.mark.slow
def test_pipeline_adds_a_head_that_the_server_uses_by_default(toy_head: Path) -> None:
    figures = json.loads((toy_head / "link_head" / "link_head.json").read_text())
    assert figures["parity_max_abs"] < 1e-3
    assert figures["served_dev_aer"] == pytest.approx(figures["dev_aer"], abs=1e-4)
    # the toy language pairs every content word with one word: the head learns it
    assert figures["dev_aer"] < 0.15
    # one head of 16 units distilled from two members of 32 trained first
    assert (figures["hidden"], figures["passes"], figures["members"]) == (16, 2, 1)
    assert (figures["span_loss"], figures["distil"]) == (2.0, 1.0)
    teacher = figures["teacher"]
    assert (teacher["hidden"], teacher["members"], len(teacher["member_dev_aer"])) == (32, 2, 2)
    assert teacher["dev_aer"] < 0.15
    bundle = load_bundle(toy_head / "bundle")
    assert bundle.has_link_head
    # the manifest says how the head was trained
    assert bundle.info["link_head"]["teacher"]["members"] == 2
    engine = Engine.load(toy_head / "bundle", CPU)
    assert engine.link_head is not None
    assert default_link_mode(engine) == pb.LINK_MODE_HEAD  # what ModelInfo tells clients
    pairs = toy_pairs(toy_head, "test")[:12]
    default = align(engine, pairs)
    head = align(engine, pairs, AlignOptions(links="head"))
    grow = align(engine, pairs, AlignOptions(links="grow"))
    assert [r.pharaoh for r in default] == [r.pharaoh for r in head]
    assert any(h.pharaoh != g.pharaoh for h, g in zip(head, grow, strict=True))
    for (source, target), result in zip(pairs, head, strict=True):
        for s, t in (tuple(map(int, link.split("-"))) for link in result.pharaoh.split()):
            assert 0 <= s < len(source.split()) and 0 <= t < len(target.split())
        # the matrices are still the attention's: rows sum to 1
        assert result.word is not None
        assert np.allclose(result.word.matrix.sum(axis=1), 1.0, atol=1e-4)


@pytest.mark.slow
def test_head_links_do_not_depend_on_the_batch(toy_head: Path) -> None:
    engine = Engine.load(toy_head / "bundle", CPU)
    pairs = toy_pairs(toy_head, "test")[:8]
    together = align(engine, pairs, AlignOptions(links="head"))
    alone = [align(engine, [pair], AlignOptions(links="head"))[0] for pair in pairs]
    assert [r.pharaoh for r in together] == [r.pharaoh for r in alone]


@pytest.mark.slow
def test_manifest_naming_a_head_without_its_files_is_refused(
    toy_head: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "bundle"
    shutil.copytree(toy_head / "bundle", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["files"]["link_lexicon.json"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"link_head.*link_lexicon.json"):
        load_bundle(copy)
    manifest["files"] = json.loads((toy_head / "bundle" / "manifest.json").read_text())["files"]
    manifest["link_head"] = {"row_threshold": 0.1, "cell_threshold": 1.5}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="cell_threshold must be a number in"):
        load_bundle(copy)


@pytest.mark.slow
def test_a_head_carries_over_to_a_bundle_with_the_same_encoder(
    toy_head: Path, tmp_path: Path, tiny: TinyModel
) -> None:
    """--from-bundle: a re-export of the same weights (the encoder and tokenizers byte for byte)
    takes the head and aligns as the original does; another model's bundle is refused."""
    run = toy_head
    again = export_bundle(run / "best.pt", run, tmp_path / "again", "toy", "0.0.2")
    config = run.parent / "toy.toml"
    argv = ["--config", str(config), "--bundle", str(again), "--out", str(tmp_path / "out")]
    assert link_head_cli.main([*argv, "--from-bundle", str(run / "bundle")]) == 0
    figures = json.loads((tmp_path / "out" / "link_head.json").read_text())
    trained = json.loads((run / "link_head" / "link_head.json").read_text())
    assert figures["served_dev_aer"] == pytest.approx(trained["served_dev_aer"], abs=1e-6)
    pairs = toy_pairs(run, "test")[:8]
    ours, original = (
        [r.pharaoh for r in align(Engine.load(b, CPU), pairs, AlignOptions(links="head"))]
        for b in (again, run / "bundle")
    )
    assert ours == original
    other = tmp_path / "other"
    shutil.copytree(tiny.bundle, other)
    with pytest.raises(ValueError, match=r"encoder\.onnx is not"):
        link_head_cli.carry_link_head(run / "bundle", other, [], tmp_path / "out2")


def test_model_without_a_head_refuses_head_links(tiny: TinyModel) -> None:
    engine = Engine.load(tiny.bundle, CPU)
    assert engine.link_head is None
    assert default_link_mode(engine) == pb.LINK_MODE_GROW
    with pytest.raises(InvalidInput, match=r"has no link head.*grow"):
        align(engine, [(tiny.sources[0], "one two")], AlignOptions(links="head"))
    # without a head the default stays grow-diag-final-and over the attention
    pairs = [(tiny.sources[0], "one two three")]
    default = align(engine, pairs)[0].pharaoh
    assert default == align(engine, pairs, AlignOptions(links="grow"))[0].pharaoh


def test_the_wire_names_the_head_mode() -> None:
    def links_of(options: pb.AlignOptions) -> str:
        request = pb.AlignRequest(pairs=[pb.AlignPair(source="a", target="b")], options=options)
        return parse_align_request(request, load_settings([], {})).options.links

    assert links_of(pb.AlignOptions(links=pb.LINK_MODE_HEAD)) == "head"
    assert links_of(pb.AlignOptions()) == ""  # the model's default


def test_a_loaded_lexicon_keeps_its_lookups_and_drops_its_pair_counts(tmp_path: Path) -> None:
    """Lexicon.load freezes its counts: the features are those of the lexicon as written, the pair
    dictionary is gone, and writing to it again is refused."""
    from service.decode.runtime.lexicon import Lexicon

    src, tgt = ["λόγος", "θεός"], ["word", "god"]
    lexicon = Lexicon.from_links([(src, tgt, [(0, 0), (1, 1)]), (src, tgt, [(0, 0)])])
    path = tmp_path / "lexicon.json"
    lexicon.save(path)
    loaded = Lexicon.load(path)
    np.testing.assert_array_equal(loaded.features(src, tgt), lexicon.features(src, tgt))
    assert loaded.forms.frozen and not loaded.forms.pairs
    with pytest.raises(ValueError, match="frozen"):
        loaded.forms.update(src, tgt, [(0, 0)])
