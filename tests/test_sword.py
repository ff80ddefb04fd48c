"""export/data/sword.py: extra English targets for the training verses from SWORD modules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from export.data import sword

# diatheke -f OSIS output, as the engWEB2015eb module prints it (shortened)
PHILEMON = """Philemon 1:1: <w>Paul</w>, <w>a</w> <w>prisoner</w> <w>of</w> <w>Christ</w><w>Jesus</w>, <w>and</w> <w>Timothy</w>,<milestone type="line"/>
Philemon 1:2: “<w>Behold</w>, <w>the</w> <w>virgin</w>
<w>shall</w> <w>be</w> <w>with</w> child—<w>God’s</w> <w>son</w>.”
(engWEB2015eb)
"""


def test_a_book_parses_into_verses_with_their_continuation_lines() -> None:
    verses = sword.parse_book(PHILEMON)
    assert sorted(verses) == [(1, 1), (1, 2)]
    assert "<w>shall</w>" in verses[(1, 2)]  # the poetry line joined to its verse
    assert "engWEB2015eb" not in verses[(1, 2)]


def test_words_are_made_like_the_bsb_words() -> None:
    verses = sword.parse_book(PHILEMON)
    # a tag separates words; punctuation off the ends; dashes split; apostrophes inside kept
    assert sword.words_of(verses[(1, 1)]) == "Paul a prisoner of Christ Jesus and Timothy"
    assert sword.words_of(verses[(1, 2)]) == "Behold the virgin shall be with child God’s son"


def fake_reader(books: dict[str, str]) -> sword.Reader:
    def read(module: str, book: str) -> str:
        assert module == "MOD"
        return books[book]

    return read


def test_each_verse_gets_the_modules_english_and_missing_ones_are_counted() -> None:
    read = fake_reader({"Philemon": PHILEMON})
    targets, missing = sword.extra_targets(["57001002", "57001009", "57001001"], "MOD", read)
    assert targets == [
        "Behold the virgin shall be with child God’s son",
        None,
        "Paul a prisoner of Christ Jesus and Timothy",
    ]
    assert missing == 1


def test_books_outside_the_corpus_are_never_read() -> None:
    def read(module: str, book: str) -> str:
        raise AssertionError(f"read {book}")

    with pytest.raises(ValueError, match="book 58"):
        sword.extra_targets(["58001001"], "MOD", read)


def write_split(folder: Path, name: str, rows: list[tuple[str, str, str, str]]) -> None:
    for k, ext in enumerate(("grc", "en", "pharaoh", "verses")):
        (folder / f"{name}.{ext}").write_text("".join(r[k] + "\n" for r in rows))


def test_the_corpus_gains_unguided_lines_and_keeps_dev_and_test(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    write_split(data, "train", [("Παῦλος δέσμιος", "Paul a prisoner", "0-0 1-2", "57001001"),
                                ("ἰδοὺ", "Look", "0-0", "57001003")])  # fmt: skip
    write_split(data, "dev", [("χάρις", "Grace", "0-0", "57001002")])
    write_split(data, "test", [("ἐν ἀρχῇ", "In the beginning", "0-0 1-2", "43001001")])
    summary = sword.write_corpus(data, out, ["MOD"], fake_reader({"Philemon": PHILEMON}))
    assert "2 BSB pairs + 1 from MOD (MOD lacks 1)" in summary
    assert (out / "train.grc").read_text().splitlines() == [
        "Παῦλος δέσμιος", "ἰδοὺ", "Παῦλος δέσμιος"]  # fmt: skip
    assert (out / "train.en").read_text().splitlines()[2] == (
        "Paul a prisoner of Christ Jesus and Timothy"
    )
    assert (out / "train.pharaoh").read_text().splitlines() == ["0-0 1-2", "0-0", ""]
    assert (out / "train.verses").read_text().splitlines()[2] == "57001001"
    for split in ("dev", "test"):
        for ext in ("grc", "en", "pharaoh", "verses"):
            assert (out / f"{split}.{ext}").read_bytes() == (data / f"{split}.{ext}").read_bytes()


def module_installed(name: str) -> bool:
    if shutil.which("diatheke") is None:
        return False
    listing = subprocess.run(
        ["diatheke", "-b", "system", "-k", "modulelist"], capture_output=True, text=True
    )
    return name in listing.stdout


@pytest.mark.skipif(
    not module_installed("engWEB2015eb"),
    reason="needs diatheke and the WEB module: apt-get install diatheke sword-text-web",
)
def test_the_installed_web_module_reads() -> None:
    targets, missing = sword.extra_targets(["57001001", "40001001"], "engWEB2015eb")
    assert missing == 0
    assert targets[1] is not None and targets[1].startswith("The book of the genealogy of Jesus")


def test_an_unknown_module_is_a_clear_error() -> None:
    if shutil.which("diatheke") is None:
        with pytest.raises(sword.SwordError, match="apt-get install diatheke"):
            sword.diatheke("engWEB2015eb", "Philemon")
    else:
        with pytest.raises(sword.SwordError, match="no Philemon in module 'NoSuchModule'"):
            sword.diatheke("NoSuchModule", "Philemon")
