"""The translate CLI: lines on stdin, translations on stdout, alignments on request."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from service.cli import translate
from service.decode.engine.engine import Engine
from service.decode.text.preparation import Prepared
from tests.conftest import TinyModel


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: str, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = translate.main(
        [*args, "--providers", "CPUExecutionProvider", "--threads", "1", "--max-len-b", "4"]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plain_align_and_json(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = str(tiny.bundle)
    code, out, _ = run(
        monkeypatch, capsys, "one\nninety-seven\n", "--bundle", bundle, "--beam", "2"
    )
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = run(monkeypatch, capsys, "ninety-seven\n", "--bundle", bundle, "--align")
    text, pharaoh, _, _ = out.rstrip("\n").split("\t")
    assert text.strip()
    assert all(len(pair.split("-")) == 2 for pair in pharaoh.split())
    code, out, _ = run(
        monkeypatch,
        capsys,
        "ninety-seven\n",
        "--bundle",
        bundle,
        "--json",
        "--nbest",
        "2",
        "--beam",
        "3",
    )
    record = json.loads(out)
    assert len(record["hypotheses"]) == 2
    first = record["hypotheses"][0]
    assert len(first["alignment"]["matrix"]) == len(first["alignment"]["target_tokens"])


def test_heatmap_png(
    tiny: TinyModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    png = tmp_path / "a.png"
    code, _, _ = run(
        monkeypatch, capsys, "ninety-seven\n", "--bundle", str(tiny.bundle), "--heatmap", str(png)
    )
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_lines_are_reported_and_the_rest_translated(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(monkeypatch, capsys, "one\n   \ntwo\n", "--bundle", str(tiny.bundle))
    assert code == 1
    assert len(out.splitlines()) == 3 and out.splitlines()[1] == ""
    assert "empty" in err


def test_missing_bundle_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "one\n", "--bundle", str(tmp_path / "nope"))
    assert code == 2 and "not found" in err


def test_align_prints_the_tokens_its_indices_count(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 16 point 14: --align printed bare subword indices. It prints the tokens the indices
    count beside them: words by default, subword pieces with --subword."""
    source = "nine hundred and ninety-seven"
    bundle = str(tiny.bundle)
    _, out, _ = run(monkeypatch, capsys, source + "\n", "--bundle", bundle, "--align")
    text, pharaoh, source_tokens, target_tokens = out.rstrip("\n").split("\t")
    assert source_tokens.split() == source.split()
    assert target_tokens.split() == text.split()
    pairs = [tuple(map(int, p.split("-"))) for p in pharaoh.split()]
    assert pairs and all(s < len(source.split()) and t < len(text.split()) for s, t in pairs)
    _, out, _ = run(monkeypatch, capsys, source + "\n", "--bundle", bundle, "--align", "--subword")
    _, pharaoh, source_tokens, target_tokens = out.rstrip("\n").split("\t")
    engine = Engine.load(tiny.bundle)
    assert source_tokens.split() == engine.prepare(source).pieces
    assert max(int(p.split("-")[0]) for p in pharaoh.split()) < len(source_tokens.split())


def test_json_floats_are_short(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The matrices were float32 rounded then printed as float64: 0.12340000271797180."""
    _, out, _ = run(
        monkeypatch,
        capsys,
        "nine hundred and ninety-seven\nMarch 5, 2021\n",
        "--bundle",
        str(tiny.bundle),
        "--json",
        "--subword",
        "--nbest",
        "2",
    )
    numbers = re.findall(r"-?\d+\.\d+(?:e-?\d+)?", out)
    assert len(numbers) > 10
    assert all(len(n.split(".")[1]) <= 4 for n in numbers), numbers


def test_lines_are_decoded_sorted_by_length_and_printed_in_input_order(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 16 point 15: lines were decoded in file order, chunk by chunk. Within a window
    (batch size x maxi-batch) they are sorted by length, longest first; the output keeps the
    input's order, each line translated as it is alone; --verbose reports the rate."""
    lines = sorted(tiny.sources, key=len)[::3][:12]
    shuffled = [lines[i] for i in (5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7)]
    engine = Engine.load(tiny.bundle)
    lengths = {line: len(engine.prepare(line).ids) for line in shuffled}
    batches: list[list[str]] = []
    real = Engine.decode_prepared

    def spy(self: Engine, prepared: list[Prepared], *args: object, **kwargs: object) -> object:
        batches.append([p.text for p in prepared])
        return real(self, prepared, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "decode_prepared", spy)
    code, out, err = run(
        monkeypatch,
        capsys,
        "".join(line + "\n" for line in shuffled),
        *("--bundle", str(tiny.bundle), "--batch-size", "3", "--maxi-batch", "2", "--verbose"),
    )
    assert code == 0
    windows = [shuffled[:6], shuffled[6:]]  # 3 x 2 lines each
    for w, window in enumerate(windows):
        decoded = [t for b in batches[2 * w : 2 * w + 2] for t in b]
        assert sorted(decoded) == sorted(window)
        assert [lengths[t] for t in decoded] == sorted((lengths[t] for t in window), reverse=True)
    batches.clear()
    options = translate.SearchOptions(max_length_b=4)
    alone = [engine.translate([line], options)[0].hypotheses[0].text for line in shuffled]
    assert out.splitlines() == alone
    assert re.search(r"translated 12 lines in [0-9.]+ s of decoding \([0-9.]+ sentences/s", err)


def test_lanes_decode_batches_side_by_side_with_the_same_output(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--lanes 2: two engines, each batch decoded by whichever is free, both used; the output
    (n-best JSON with matrices, a bad line reported and left empty) byte for byte one lane's."""
    lines = [*sorted(tiny.sources, key=len)[::4][:10], "   ", tiny.sources[0]]
    stdin = "".join(line + "\n" for line in lines)
    flags = ("--bundle", str(tiny.bundle), "--batch-size", "2", "--json", "--nbest", "2")
    code_one, one, _ = run(monkeypatch, capsys, stdin, *flags)
    engines: set[int] = set()
    real = Engine.decode_prepared

    def spy(self: Engine, prepared: list[Prepared], *args: object, **kwargs: object) -> object:
        engines.add(id(self))
        return real(self, prepared, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "decode_prepared", spy)
    code_two, two, err_two = run(monkeypatch, capsys, stdin, *flags, "--lanes", "2")
    assert (code_one, code_two) == (1, 1)  # the blank line
    assert two == one and len(two.splitlines()) == len(lines)
    assert two.splitlines()[-2] == "" and "empty" in err_two
    assert len(engines) == 2


def test_lanes_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        translate.parse_args(["--lanes", "0"])
    assert "--lanes must be >= 1" in capsys.readouterr().err


def test_every_translate_flag_has_a_description() -> None:
    """Issue 16 point 10: --nbest, --max-len-a/b and --providers had no description."""
    parser_help = io.StringIO()
    with pytest.raises(SystemExit):
        import contextlib

        with contextlib.redirect_stdout(parser_help):
            translate.parse_args(["--help"])
    text = parser_help.getvalue()
    assert text.startswith("usage: s2s-translate")
    for flag in ("--nbest", "--max-len-a", "--max-len-b", "--providers", "--batch-size",
                 "--maxi-batch", "--subword", "--verbose", "--threads", "--int8"):  # fmt: skip
        block = text.split(flag, 1)[1].split("\n  --", 1)[0]
        assert len(block.split()) >= 3, (flag, block)
