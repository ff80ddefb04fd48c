"""Subword segmenters and tokenizers of imported models (service/model/subword.py, vocab.py), and
the SentencePiece vocabulary restriction the importer bakes in (export/importers/spm_vocab.py).
No toolkit needed: the SentencePiece model and BPE codes are trained here on a few lines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
from subword_nmt.learn_bpe import learn_bpe

from export.importers.spm_vocab import restrict_to_vocabulary
from service.model import bundle as bundle_format
from service.model.architecture import EOS_ID, UNK_ID
from service.model.bundle import BundleError, load_bundle
from service.model.pretokenizer import Moses
from service.model.subword import (
    WORD_START,
    BpeSegmenter,
    SentencePieceSegmenter,
    mark_words,
    word_indices,
    word_starts,
)
from service.model.tokenizer import TokenizerError
from service.model.vocab import SubwordTokenizer, WordTokenizer, load_tokenizers

TEXT = ["the kalomi sings to the retu", "a retu and a kalomi", "kalomi kalomi retu sings"] * 20


@pytest.fixture
def tiny_bundle_copy(tiny: object, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(tiny.bundle, out)  # type: ignore[attr-defined]
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("subword") / "corpus.txt"
    path.write_text("".join(line + "\n" for line in TEXT), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def spm_model(corpus: Path) -> Path:
    prefix = corpus.parent / "spm"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=22, minloglevel=2
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def bpe_codes(corpus: Path) -> Path:
    codes = corpus.parent / "codes"
    with corpus.open() as infile, codes.open("w") as outfile:
        learn_bpe(infile, outfile, 12)
    return codes


def test_pieces_map_onto_the_text_words() -> None:
    text = "Hello,  wonderful world"
    # pieces of a pre-tokenized, lowercased text: "hello , wonder@@ ful world"
    assert word_indices(text, ["hello", ",", "wonder", "ful", "world"]) == [0, 0, 1, 1, 2]
    # an unknown piece ("") belongs to the word where it stands; a special (None) to none
    assert word_indices("Hello zzz world", ["hello", "", "world", None]) == [0, 1, 2, None]
    assert word_indices("Hello zzz world", ["hello", "", "wor", "ld"]) == [0, 1, 2, 2]
    # an escaped piece that spells other characters still lands in its word
    assert word_indices("don't stop", ["don", "&apos;t", "stop"]) == [0, 0, 1]
    assert word_starts([0, 0, 1, 1, None]) == [True, False, True, False, True]
    assert mark_words(["a", "b", "c"], [True, False, True]) == [
        WORD_START + "a",
        "b",
        WORD_START + "c",
    ]


def test_bpe_segmenter_round_trip(bpe_codes: Path) -> None:
    bpe = BpeSegmenter.load(bpe_codes, "@@", None)
    pieces = bpe.split("  the kalomi sings  ")
    assert any(p.endswith("@@") for p in pieces), pieces  # words are cut
    assert bpe.join(pieces) == "the kalomi sings"
    assert [bpe.surface(p) for p in pieces if not p.endswith("@@")][-1] == "sings"[
        -len(pieces[-1]) :
    ]
    # restricted to a vocabulary (Joey NMT): merges whose result it lacks are undone
    restricted = BpeSegmenter.load(bpe_codes, "@@", ["t@@", "h@@", "e"])
    assert restricted.split("the") == ["t@@", "h@@", "e"]


def test_sentencepiece_segmenter_joins_as_each_toolkit(spm_model: Path) -> None:
    onmt = SentencePieceSegmenter.load(spm_model, "opennmt-py")
    joey = SentencePieceSegmenter.load(spm_model, "joeynmt")
    pieces = onmt.split("the kalomi sings")
    assert pieces[0].startswith(WORD_START)
    assert onmt.join(pieces) == joey.join(pieces) == "the kalomi sings"
    assert joey.join([WORD_START, *pieces]) == "the kalomi sings"  # Joey strips


def test_restricted_sentencepiece_model_cuts_unknown_pieces(spm_model: Path) -> None:
    """SetVocabulary's rule: pieces outside the vocabulary (one-character pieces excepted) are
    never produced."""
    full = spm.SentencePieceProcessor(model_file=str(spm_model))
    pieces = full.encode("kalomi retu", out_type=str)
    keep = [p for p in pieces if p != max(pieces, key=len)]
    restricted = spm.SentencePieceProcessor()
    restricted.LoadFromSerializedProto(restrict_to_vocabulary(full.serialized_model_proto(), keep))
    cut = restricted.encode("kalomi retu", out_type=str)
    assert max(pieces, key=len) not in cut
    assert all(p in keep or len(p) == 1 for p in cut), cut
    assert "".join(cut) == "".join(pieces)


def subword_bundle(bundle: Path, spm_model: Path, bpe_codes: Path) -> Path:
    """The tiny bundle with a "subword" tokenizer: sentencepiece source, BPE target."""
    src_pieces = [
        p
        for p, _ in (
            line.split("\t") for line in spm_model.with_suffix(".vocab").read_text().splitlines()
        )
    ]
    src_vocab = ["<blank>", "<s>", "</s>", "<unk>"] + [
        p for p in src_pieces if not p.startswith("<")
    ]
    bpe = BpeSegmenter.load(bpe_codes, "@@", None)
    tgt_pieces = sorted({p for line in TEXT for p in bpe.split(line)})
    tgt_vocab = ["<blank>", "<s>", "</s>", "<unk>", *tgt_pieces]
    (bundle / "source.vocab").write_text("".join(t + "\n" for t in src_vocab))
    (bundle / "target.vocab").write_text("".join(t + "\n" for t in tgt_vocab))
    (bundle / "source.spm.model").write_bytes(spm_model.read_bytes())
    (bundle / "target.bpe.codes").write_bytes(bpe_codes.read_bytes())
    return bundle


def test_subword_tokenizer_from_the_manifest(
    tiny_bundle_copy: Path, spm_model: Path, bpe_codes: Path
) -> None:
    bundle = subword_bundle(tiny_bundle_copy, spm_model, bpe_codes)
    manifest = json.loads((bundle / "manifest.json").read_text())
    section: dict[str, Any] = {
        "kind": "subword",
        "toolkit": "joeynmt",
        "source": {
            "file": "source.vocab",
            "segmenter": "sentencepiece",
            "model": "source.spm.model",
            "append_eos": True,
        },
        "target": {
            "file": "target.vocab",
            "segmenter": "bpe",
            "model": "target.bpe.codes",
            "separator": "@@",
        },
    }
    bundle_format.write_manifest(bundle, "n", "1", manifest["architecture"], tokenizer=section)
    src, tgt = load_tokenizers(load_bundle(bundle))
    assert isinstance(src, SubwordTokenizer) and isinstance(tgt, SubwordTokenizer)
    ids = src.encode("the kalomi zzz")
    assert ids[-1] == EOS_ID and UNK_ID in ids
    pieces = src.pieces(ids, "the kalomi zzz")
    words = "".join(pieces).split(WORD_START)[1:]
    assert words[:2] == ["the", "kalomi"] and words[-1] == "</s>"
    out = tgt.encode("the kalomi sings")
    assert tgt.decode(out) == "the kalomi sings"
    shown = tgt.pieces(out)
    assert "".join(shown).replace(WORD_START, " ").split() == ["the", "kalomi", "sings"]
    # each piece's part of the answer text: they join to its words (word alignments' labels)
    surfaces = tgt.surfaces(out)
    assert len(surfaces) == len(out) and "".join(surfaces) == "the kalomi sings"

    # a manifest naming a file outside the bundle is refused
    section["target"]["model"] = "../codes"
    (bundle / "manifest.json").write_text(json.dumps({**manifest, "tokenizer": section}))
    with pytest.raises(BundleError, match=r"target\.model must name a file in the bundle"):
        load_bundle(bundle)


def test_word_tokenizer_pieces_ignore_the_text(tmp_path: Path) -> None:
    path = tmp_path / "v"
    path.write_text("<blank>\n<s>\n</s>\n<unk>\nhello\n")
    tok = WordTokenizer.load(path)
    assert tok.pieces([4], "hello") == tok.pieces([4]) == ["hello"]


def test_moses_pieces_are_marked_on_the_client_words(bpe_codes: Path, tmp_path: Path) -> None:
    """Joey NMT's moses pre-tokenizer splits and escapes ("don &apos;t", "&amp;"); the pieces
    still group into the words the client sent, and decoding detokenizes."""
    pytest.importorskip("sacremoses")
    text = "the kalomi, don't [sing] & retu."
    moses = Moses.load("en")
    bpe = BpeSegmenter.load(bpe_codes, "@@", None)
    pieces = bpe.split(moses.tokenize(text))
    path = tmp_path / "vocab"
    path.write_text(
        "".join(t + "\n" for t in ["<blank>", "<s>", "</s>", "<unk>", *sorted(set(pieces))])
    )
    tok = SubwordTokenizer(vocab=WordTokenizer.load(path), segmenter=bpe, pretokenizer=moses)
    ids = tok.encode(text)
    assert UNK_ID not in ids
    marked = tok.pieces(ids, text)
    assert len(marked) == len(ids)
    assert sum(p.startswith(WORD_START) for p in marked) == len(text.split())
    assert tok.decode(ids) == text
    assert sum(p.startswith(WORD_START) for p in tok.pieces(ids)) == len(text.split())


def test_malformed_bpe_codes_are_a_tokenizer_error(tmp_path: Path) -> None:
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\na b c\n")
    with pytest.raises(TokenizerError, match="cannot read BPE codes"):
        BpeSegmenter.load(codes, "@@", None)
    with pytest.raises(TokenizerError, match="not found"):
        BpeSegmenter.load(tmp_path / "missing", "@@", None)


def test_joey_output_of_no_text_is_its_unk_token(spm_model: Path, tmp_path: Path) -> None:
    """A hypothesis that decodes to no text (a lone "▁") is Joey NMT's UNK token, as its
    prediction writes it; OpenNMT-py's is empty."""
    path = tmp_path / "vocab"
    path.write_text("<pad>\n<s>\n</s>\n<unk>\n\u2581\nthe\n")
    vocab = WordTokenizer.load(path)
    for toolkit, expected in (("joeynmt", "<unk>"), ("opennmt-py", "")):
        segmenter = SentencePieceSegmenter.load(spm_model, toolkit)
        tok = SubwordTokenizer(vocab=vocab, segmenter=segmenter, joey_output=toolkit == "joeynmt")
        assert tok.decode([4]) == expected
        assert len(tok.pieces([4])) == 1
        assert "".join(tok.surfaces([4])).split() == expected.split()
