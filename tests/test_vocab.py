"""Word-level tokenizers and the manifest's tokenizer section (no toolkit needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.model import bundle as bundle_format
from service.model.architecture import EOS_ID, UNK_ID
from service.model.bundle import BundleError, load_bundle
from service.model.tokenizer import TokenizerError
from service.model.vocab import WordTokenizer, is_word_level, load_tokenizers

TOKENS = ["<blank>", "<s>", "</s>", "<unk>", "hello", "world", "Hello"]


def vocab(tmp_path: Path, tokens: list[str] = TOKENS) -> Path:
    path = tmp_path / "source.vocab"
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def test_word_tokenizer_round_trip_and_unknown_words(tmp_path: Path) -> None:
    tok = WordTokenizer.load(vocab(tmp_path))
    assert tok.vocab_size == len(TOKENS)
    ids = tok.encode("  hello   strange world ")
    assert ids == [4, UNK_ID, 5]
    assert tok.pieces(ids) == ["hello", "<unk>", "world"]
    assert tok.decode(ids) == "hello <unk> world"
    assert is_word_level(tok)


def test_word_tokenizer_options(tmp_path: Path) -> None:
    joey = WordTokenizer.load(vocab(tmp_path), lowercase=True, append_eos=True)
    assert joey.encode("Hello WORLD") == [4, 5, EOS_ID]
    assert joey.encode("   ") == []  # nothing to translate: no lone EOS
    assert WordTokenizer.load(vocab(tmp_path)).encode("Hello") == [6]


def test_word_tokenizer_refuses_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not found"):
        WordTokenizer.load(tmp_path / "missing.vocab")
    with pytest.raises(TokenizerError, match="fewer than the 4 special tokens"):
        WordTokenizer.load(vocab(tmp_path, ["<blank>", "<s>"]))


def test_manifest_tokenizer_section(tiny_bundle_copy: Path) -> None:
    """A bundle declaring word vocabularies needs them (and not SentencePiece models); the engine's
    tokenizers follow the manifest; our own bundles without the section stay SentencePiece."""
    plain = load_bundle(tiny_bundle_copy)
    assert plain.tokenizer == {"kind": "sentencepiece"}
    src, _ = load_tokenizers(plain)
    assert not is_word_level(src)

    for side in ("source", "target"):
        (tiny_bundle_copy / f"{side}.model").unlink()
        (tiny_bundle_copy / f"{side}.vocab").write_text("".join(t + "\n" for t in TOKENS))
    manifest = json.loads((tiny_bundle_copy / "manifest.json").read_text())
    section = {
        "kind": "word",
        "source": {"file": "source.vocab", "append_eos": True},
        "target": {"file": "target.vocab"},
    }
    with pytest.raises(BundleError, match="missing"):  # write_manifest checks the files it needs
        bundle_format.write_manifest(tiny_bundle_copy / "nowhere", "n", "1", {}, tokenizer=section)
    bundle_format.write_manifest(
        tiny_bundle_copy,
        manifest["name"],
        manifest["version"],
        manifest["architecture"],
        tokenizer=section,
    )
    word = load_bundle(tiny_bundle_copy)
    src, tgt = load_tokenizers(word)
    assert is_word_level(src) and is_word_level(tgt)
    assert src.encode("hello") == [4, EOS_ID]

    manifest = json.loads((tiny_bundle_copy / "manifest.json").read_text())
    manifest["tokenizer"]["kind"] = "bpe"
    (tiny_bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="unknown tokenizer kind 'bpe'"):
        load_bundle(tiny_bundle_copy)


@pytest.fixture
def tiny_bundle_copy(tiny: object, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, out)  # type: ignore[attr-defined]
    return out
