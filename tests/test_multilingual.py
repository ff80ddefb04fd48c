"""A multilingual model (OPUS-MT's en-ROMANCE, the Tatoeba group models): the `>>fra<<` token a
source begins with chooses the target language. The bundle lists its languages (ModelInfo's
target_languages), the tokenizer reads the token as transformers' MarianTokenizer does, and the
answers for each language, asked by the `target_language` option or by the token in the text, are
MarianMTModel.generate's on MarianTokenizer's ids.

The model is made here (export/toolkits/hf_fixture.py with two languages: `>>fra<<` copies the
number words, `>>spa<<` writes each word one place on), a 1 + 1 layer Marian trained 600 steps on
one thread (about 15 s), saved as the Hub's conversions are and imported by s2s-import huggingface.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from export.importers.common import write_vocab  # noqa: E402
from export.importers.huggingface import import_model  # noqa: E402
from export.importers.marian_vocab import read_vocab, vocab_order  # noqa: E402
from export.toolkits.hf_fixture import corpus, in_language, write_model  # noqa: E402
from proto.translation.v1 import translation_pb2 as pb  # noqa: E402
from service.cli import translate as translate_cli  # noqa: E402
from service.decode.engine.engine import Engine  # noqa: E402
from service.decode.shared.config import RuntimeConfig  # noqa: E402
from service.decode.shared.errors import InvalidInput  # noqa: E402
from service.decode.shared.options import SearchOptions  # noqa: E402
from service.model import languages  # noqa: E402
from service.model.bundle import load_bundle, sha256_of  # noqa: E402
from tests.conftest import TinyModel  # noqa: E402
from tests.test_http import call  # noqa: E402
from tests.test_server import ServerThread, base_args  # noqa: E402

LANGUAGES = ("fra", "spa")
TEXTS = corpus(12, seed=11)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield write_model(
            tmp_path_factory.mktemp("hf") / "opus-mt-en-ROMANCE",
            layers=1,
            vocab_size=46,  # every number word one piece
            train_steps=600,
            languages=LANGUAGES,
        )
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bundle(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_model(hf_dir, tmp_path_factory.mktemp("b") / "bundle", "multi", "1")


@pytest.fixture(scope="module")
def hf(hf_dir: Path) -> tuple[Any, Any]:
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(str(hf_dir), attn_implementation="eager").eval()
    return model, MarianTokenizer.from_pretrained(str(hf_dir))


@pytest.fixture(scope="module")
def engine(bundle: Path) -> Engine:
    config = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1, search="host")
    return Engine.load(bundle, config)


@pytest.fixture(scope="module")
def server(bundle: Path, engine: Engine) -> Iterator[ServerThread]:
    srv = ServerThread.start([*base_args(bundle), "--no-warmup", "--http-port", "0"], engine)
    yield srv
    srv.close()


def options(engine: Engine, **values: Any) -> SearchOptions:
    return SearchOptions(**{**engine.decoding_defaults, **values})


def their_pieces(hf_dir: Path, ids: list[int]) -> list[str]:
    by_id = {i: p for p, i in json.loads((hf_dir / "vocab.json").read_text()).items()}
    return [by_id[i] for i in ids]


def our_pieces(bundle: Path, ids: list[int]) -> list[str]:
    vocab = (bundle / "source.vocab").read_text(encoding="utf-8").split("\n")
    return [vocab[i] for i in ids]


def test_the_bundle_lists_the_vocabularys_language_tokens(bundle: Path, hf: Any) -> None:
    """Read at load from the source vocabulary: what MarianTokenizer calls its
    supported_language_codes, without the >> <<, sorted."""
    _, tokenizer = hf
    assert load_bundle(bundle).target_languages == LANGUAGES
    assert sorted(tokenizer.supported_language_codes) == [f">>{x}<<" for x in LANGUAGES]


@pytest.mark.parametrize(
    "text", [">>fra<< one two", ">>spa<<one two", ">>fra<<  one", ">>spa<< three point four"]
)
def test_a_leading_token_is_read_as_marian_tokenizer_reads_it(
    engine: Engine, bundle: Path, hf_dir: Path, hf: Any, text: str
) -> None:
    """One piece for the token, then the rest as SentencePiece cuts it (whitespace as typed), then
    `</s>`: MarianTokenizer's ids, piece for piece."""
    _, tokenizer = hf
    prepared = engine.prepare(text)
    assert our_pieces(bundle, prepared.ids) == their_pieces(hf_dir, tokenizer(text).input_ids)
    assert prepared.language == text[2:5]
    assert prepared.pieces[0] == f"▁>>{prepared.language}<<"  # a word of its own


def test_the_option_reads_as_the_token_first(engine: Engine) -> None:
    """target_language puts its token first, as if the text began with it; whitespace before a
    text's own token is allowed (MarianTokenizer reads a token only at the very start)."""
    for text in TEXTS[:4]:
        for name in LANGUAGES:
            by_text = engine.prepare(f">>{name}<< {text}")
            assert engine.prepare(text, name).ids == by_text.ids
            assert engine.prepare(text, name).pieces == by_text.pieces
            assert engine.prepare(f"  >>{name}<< {text}").ids == by_text.ids
            assert engine.prepare(by_text.text, name).ids == by_text.ids  # the same: fine
    # without a language the model reads the text as it is (no token)
    assert engine.prepare("one two").ids == engine.src_tok.encode("one two")


@pytest.mark.parametrize("beam", [1, 5])
def test_each_languages_answers_are_generates(engine: Engine, hf: Any, beam: int) -> None:
    """For each language, asked by the option and by the token in the text: the best translation
    is MarianMTModel.generate's on MarianTokenizer's ids for `>>xxx<< text`, greedy and at beam 5;
    the two languages answer differently."""
    model, tokenizer = hf
    answers: dict[str, list[str]] = {}
    for name in LANGUAGES:
        expected = []
        for text in TEXTS:
            with torch.no_grad():
                batch = tokenizer([f">>{name}<< {text}"], return_tensors="pt")
                ids = model.generate(**batch, num_beams=beam)
            expected.append(tokenizer.decode(ids[0], skip_special_tokens=True))
        chosen = options(engine, beam_size=beam, n_best=1, target_language=name)
        by_option = [t.hypotheses[0].text for t in engine.translate(TEXTS, chosen, "none")]
        in_text = [f">>{name}<< {text}" for text in TEXTS]
        plain = options(engine, beam_size=beam, n_best=1)
        by_token = [t.hypotheses[0].text for t in engine.translate(in_text, plain, "none")]
        assert by_option == expected
        assert by_token == expected
        answers[name] = expected
    differ = sum(a != b for a, b in zip(answers["fra"], answers["spa"], strict=True))
    assert differ > len(TEXTS) // 2, answers
    # trained: each language writes its own rule for most texts
    right = {n: sum(a == in_language(t, k) for a, t in zip(answers[n], TEXTS, strict=True))
             for k, n in enumerate(LANGUAGES)}  # fmt: skip
    assert min(right.values()) >= len(TEXTS) // 4, (right, answers)


def test_a_language_the_model_lacks_is_refused_naming_its_own(engine: Engine) -> None:
    with pytest.raises(InvalidInput) as err:
        engine.check_options(options(engine, target_language="ita"), "none")
    assert str(err.value) == "target_language 'ita' is not one of this model's: fra, spa"
    with pytest.raises(InvalidInput, match="target_language 'ita' is not one of this model's"):
        engine.translate(["one"], options(engine, target_language="ita"))
    with pytest.raises(InvalidInput, match=r"begins with >>ita<<, .* languages: fra, spa"):
        engine.prepare(">>ita<< one two")


def test_a_token_and_a_different_option_are_refused(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match="begins with >>spa<< but target_language is 'fra'"):
        engine.translate([">>spa<< one two"], options(engine, target_language="fra"))
    with pytest.raises(InvalidInput, match="holds only its >>fra<< token"):
        engine.prepare(">>fra<<  ")
    same = engine.translate([">>spa<< one two"], options(engine, target_language="spa"))
    alone = engine.translate(["one two"], options(engine, target_language="spa"))
    assert same[0].hypotheses[0].text == alone[0].hypotheses[0].text


def test_a_model_with_one_target_language_refuses_the_option(tiny: TinyModel) -> None:
    """Its vocabulary holds no >>xxx<< token: a text beginning like one is text."""
    one = Engine.load(tiny.bundle, RuntimeConfig(intra_op_threads=1))
    assert one.bundle.target_languages == ()
    with pytest.raises(InvalidInput, match="has one target language") as err:
        one.check_options(SearchOptions(target_language="fra"), "none")
    assert "leave target_language empty" in str(err.value)
    assert one.prepare(">>fra<< one").ids == one.src_tok.encode(">>fra<< one")


def test_the_memory_answers_per_language(engine: Engine, tmp_path: Path) -> None:
    """A multilingual model's memory holds each language's sources with their token: an entry
    answers the requests for its language only."""
    from service.decode.requests.in_process import translate_with_memory

    memory = tmp_path / "memory.tsv"
    memory.write_text(">>spa<< one two\tuno dos\n", encoding="utf-8")
    engine.user_memory = engine.read_memory(memory)
    try:
        spa, fra = (
            translate_with_memory(engine, ["one two"], options(engine, target_language=x), "none")
            for x in ("spa", "fra")
        )
        typed = translate_with_memory(engine, [">>spa<< one two"], options(engine), "none")
    finally:
        engine.user_memory = engine.bundle_memory
    assert spa[0].hypotheses[0].text == typed[0].hypotheses[0].text == "uno dos"
    assert spa[0].hypotheses[0].origin == "memory"
    assert fra[0].hypotheses[0].origin != "memory"


def test_the_server_lists_and_takes_the_languages(server: ServerThread, engine: Engine) -> None:
    """ModelInfo's target_languages over gRPC and HTTP/JSON; Translate's target_language over
    both, its answers the engine's; an unknown one INVALID_ARGUMENT naming the model's."""
    info = server.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=30)
    assert list(info.target_languages) == list(LANGUAGES)
    port = server.r.http_port
    assert port is not None
    assert call(port, "/v1/GetModelInfo", method="GET").body["target_languages"] == list(LANGUAGES)
    want = engine.translate(TEXTS[:3], options(engine, target_language="spa"), "none")
    request = pb.TranslateRequest(
        texts=TEXTS[:3], options=pb.DecodingOptions(target_language="spa")
    )
    got = server.stub.Translate(request, timeout=30)
    texts = [t.hypotheses[0].text for t in got.translations]
    assert texts == [t.hypotheses[0].text for t in want]
    body = json_format.MessageToDict(request)
    answer = call(port, "/v1/Translate", body)
    assert answer.status == 200, answer.body
    assert [t["hypotheses"][0]["text"] for t in answer.body["translations"]] == texts
    bad = pb.TranslateRequest(texts=["one"], options=pb.DecodingOptions(target_language="xyz"))
    with pytest.raises(grpc.RpcError) as err:
        server.stub.Translate(bad, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "target_language 'xyz' is not one of this model's: fra, spa" in str(err.value.details())


def test_s2s_translate_takes_target_language(
    bundle: Path,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--target-language, from the options table: the engine's answers; an unknown one refused
    on each line, naming the model's."""
    argv = ["--bundle", str(bundle), "--providers", "CPUExecutionProvider", "--threads", "1"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TEXTS[:2]) + "\n"))
    assert translate_cli.main([*argv, "--target-language", "spa"]) == 0
    got = capsys.readouterr().out.splitlines()
    want = engine.translate(TEXTS[:2], options(engine, target_language="spa"), "none")
    assert got == [t.hypotheses[0].text for t in want]
    monkeypatch.setattr("sys.stdin", io.StringIO("one\n"))
    assert translate_cli.main([*argv, "--target-language", "ita"]) != 0
    assert "not one of this model's: fra, spa" in capsys.readouterr().err


def test_a_marian_vocabulary_keeps_its_language_tokens(bundle: Path, tmp_path: Path) -> None:
    """OPUS-MT's .yml vocabulary of pieces: the Marian importer's reading keeps the >>xxx<<
    entries in the bundle's source vocabulary, which then lists them (here the Hugging Face
    bundle's vocabulary swapped for one written as the Marian importer writes it)."""
    yml = tmp_path / "opus.spm32k-spm32k.vocab.yml"
    entries = ["</s>", "<unk>", ">>fra<<", ">>por<<", ">>ita<<", "▁one", "▁>>", "a>>b<<"]
    yml.write_text("".join(f'"{p}": {i}\n' for i, p in enumerate(entries)), encoding="utf-8")
    vocab = read_vocab(yml, "source")
    assert vocab.tokens == entries
    copy = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    write_vocab(copy / "source.vocab", *vocab_order(vocab, "source"), "source")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["source.vocab"] = sha256_of(copy / "source.vocab")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert load_bundle(copy).target_languages == ("fra", "ita", "por")


def test_target_language_tokens() -> None:
    assert languages.target_languages([">>fra<<", ">>zho_Hans<<", "▁>>x<<", ">><<", ">>a b<<"]) == (
        "fra",
        "zho_Hans",
    )
    assert languages.leading(" >>fra<< x") == ("fra", " x")
    assert languages.leading(">>fra<<<<x") == ("fra", "<<x")
    assert languages.leading(">> a b << c") is None
    assert languages.leading("x >>fra<<") is None


def test_a_document_asks_its_leading_token_of_every_sentence(engine: Engine) -> None:
    """A document that begins with >>spa<<, cut at its newlines (split_sentences on, an imported
    Transformer's default): each sentence answers as sent alone with target_language spa."""
    from service.decode.requests import in_process

    lines = TEXTS[:3]
    document = ">>spa<< " + "\n".join(lines)
    [doc] = in_process.translate(engine, [document], options(engine, split_sentences="on"), "none")
    alone = in_process.translate(engine, lines, options(engine, target_language="spa"), "none")
    hyp = doc.hypotheses[0]
    texts = [hyp.text[a:b] for a, b in hyp.sentence_spans]
    assert texts[1:] == [t.hypotheses[0].text for t in alone[1:]]
    assert engine.decoding_defaults.get("split_sentences") == "on"  # s2s-import's for a Transformer
