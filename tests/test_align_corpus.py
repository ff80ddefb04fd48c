"""s2s-align-corpus (export/align_corpus.py): two text files in, one Pharaoh line per line out.

The toy language of tests/test_parallel_corpus.py with a few lines blank on both sides, a tiny
recipe: the links, trained on eflomal's links only, are scored against the toy's gold; a second run
over the same work folder resumes (trains nothing, aligns only what the first left undone); bad
input is refused with the file and line, a too-small corpus with the minimum.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from export import align_corpus
from export.metrics.aer import parse_pharaoh, score_corpus
from tests.test_parallel_corpus import write_corpus

RECIPE = """
[model]
emb_dim = 24
enc_hidden = 24
dec_hidden = 48
attn_dim = 24
dropout = 0.0

[data]
src_vocab = 40
tgt_vocab = 40

[optim]
lr = 0.01
max_tokens = 600
max_steps = 120
eval_every = 40
patience = 10
threads = 1
guided_alignment = 0.5

[link_head]
epochs = 5
hidden = 32
threads = 1
"""
BLANK = (5, 77, 300)  # 0-based input lines left blank on both sides


def write_toy(folder: Path) -> tuple[Path, Path, list[str]]:
    """The toy corpus with BLANK lines inserted; returns both files and the gold per line."""
    src, tgt, al = write_corpus(folder, 440)
    columns = [p.read_text().splitlines() for p in (src, tgt, al)]
    for i in BLANK:
        for column in columns:
            column.insert(i, "")
    for path, column in zip((src, tgt, al), columns, strict=True):
        path.write_text("\n".join(column) + "\n")
    return src, tgt, columns[2]


@pytest.fixture(scope="module")
def aligned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    folder = tmp_path_factory.mktemp("align-corpus")
    src, tgt, gold = write_toy(folder)
    (folder / "recipe.toml").write_text(RECIPE)
    argv = ["--source", str(src), "--target", str(tgt), "--out", str(folder / "out.links")]
    argv += ["--minutes", "10", "--config", str(folder / "recipe.toml")]
    assert align_corpus.main([*argv, "--bundle", str(folder / "bundle")]) == 0
    return folder, argv, gold


@pytest.mark.slow
def test_one_pharaoh_line_per_input_line_better_than_nothing(
    aligned: tuple[Path, list[str], list[str]],
) -> None:
    folder, _, gold = aligned
    lines = (folder / "out.links").read_text().split("\n")[:-1]
    assert len(lines) == len(gold) == 440 + len(BLANK)
    assert all(lines[i] == "" for i in BLANK)
    predicted = [parse_pharaoh(x) for i, x in enumerate(lines) if i not in BLANK]
    truth = [parse_pharaoh(x) for i, x in enumerate(gold) if i not in BLANK]
    assert score_corpus(predicted, truth).aer < 0.2
    manifest = json.loads((folder / "bundle" / "manifest.json").read_text())
    assert manifest["info"]["link_head"]["links_source"]["teacher"] == "eflomal"


@pytest.mark.slow
def test_a_second_run_resumes_without_training_again(
    aligned: tuple[Path, list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, argv, _ = aligned
    first = (folder / "out.links").read_text()
    out = folder / "out.links"
    # interrupted after 100 lines of the alignment stage: the rest is aligned, nothing retrained
    out.rename(folder / "out.links.partial")
    partial = folder / "out.links.partial"
    partial.write_text("".join(line + "\n" for line in first.split("\n")[:100]))

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(align_corpus, "train", no_training)
    monkeypatch.setattr(align_corpus, "train_link_head", no_training)
    assert align_corpus.main(argv) == 0
    assert out.read_text() == first
    assert not partial.exists()


@pytest.mark.slow
def test_the_teachers_links_need_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--links teacher without --bundle: eflomal as the recipe runs it, no training, one line per
    input line in the corpus's order (the dev pairs held out put back in place)."""
    src, tgt, gold = write_toy(tmp_path)

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained a model for the teacher's links")

    monkeypatch.setattr(align_corpus, "train", no_training)
    monkeypatch.setattr(align_corpus, "train_link_head", no_training)
    out = tmp_path / "teacher.links"
    argv = ["--source", str(src), "--target", str(tgt), "--out", str(out), "--links", "teacher"]
    assert align_corpus.main(argv) == 0
    lines = out.read_text().split("\n")[:-1]
    assert len(lines) == len(gold) and all(lines[i] == "" for i in BLANK)
    data = tmp_path / "teacher.links.work" / "run" / "data"
    dev = (data / "dev.eflomal.pharaoh").read_text().splitlines()
    nonblank = [x for i, x in enumerate(lines) if i not in BLANK]
    # write_splits holds out every 20th pair: the 20th pair's line is dev's first
    assert nonblank[19] == dev[0] and nonblank[39] == dev[1]
    predicted = [parse_pharaoh(x) for x in nonblank]
    truth = [parse_pharaoh(x) for i, x in enumerate(gold) if i not in BLANK]
    assert score_corpus(predicted, truth).aer < 0.2


def write(folder: Path, src: str, tgt: str | bytes) -> list[str]:
    (folder / "s").write_text(src, encoding="utf-8")
    data = tgt if isinstance(tgt, bytes) else tgt.encode()
    (folder / "t").write_bytes(data)
    return ["--source", str(folder / "s"), "--target", str(folder / "t")]


@pytest.mark.parametrize(
    ("src", "tgt", "message"),
    [
        ("a b\nc d\n", "x y\n", "has 2 lines but .*t has 1"),
        ("a b\nc d\n", "x y\n\n", r"t:2: empty line, but line 2 of .*s is not"),
        ("a b\nc d\n", b"x y\nz \xe9\n", r"t:2: not UTF-8"),
        ("a b\n" * 50, "x y\n" * 50, "hold 50 sentence pairs: too few .*at least 200"),
    ],
)
def test_bad_input_is_refused_naming_the_file_and_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    src: str,
    tgt: str | bytes,
    message: str,
) -> None:
    argv = [*write(tmp_path, src, tgt), "--out", str(tmp_path / "o")]
    assert align_corpus.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
