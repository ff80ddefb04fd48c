"""benchmarks/importing/compare_bundles.py: the same outputs or exit 1, then the two bundles' speeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.importing import compare_bundles
from export.onnx.to_onnx import export_bundle, export_graphs
from export.train.checkpoint import save_checkpoint
from export.train.model import Seq2Seq
from service.model.bundle import sha256_of
from tests.conftest import TinyModel


def with_unfolded_decoder(tiny: TinyModel, out: Path) -> Path:
    """A copy of the tiny bundle whose decoder step multiplies its embeddings (no folded tables)."""
    shutil.copytree(tiny.bundle, out)
    graphs = out.parent / "unfolded_graphs"
    graphs.mkdir()
    export_graphs(tiny.model, graphs, fold_limit_bytes=0)
    shutil.copyfile(graphs / "decoder.onnx", out / "decoder.onnx")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"]["decoder.onnx"] = sha256_of(out / "decoder.onnx")
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def run(old: Path, new: Path, source: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = [str(old), str(new), "--source", str(source), "--limit", "40", "--repeats", "1"]
    status = compare_bundles.main(argv)
    return status, capsys.readouterr().out.strip().splitlines()[-1]


def test_an_unfolded_decoder_gives_the_same_outputs(
    tiny: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source.txt"
    source.write_text("\n".join(tiny.sources) + "\n")
    unfolded = with_unfolded_decoder(tiny, tmp_path / "unfolded")
    status, line = run(unfolded, tiny.bundle, source, capsys)
    assert status == 0
    report = json.loads(line)
    assert report["identical"] == f"{len(tiny.sources)}/{len(tiny.sources)}"
    assert report["old_sent_per_s"] > 0 and report["new_sent_per_s"] > 0


def test_another_model_is_refused(
    tiny: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "source.txt"
    source.write_text("\n".join(tiny.sources) + "\n")
    other = Seq2Seq(tiny.model.cfg).eval()  # new random weights, same tokenizers
    save_checkpoint(tmp_path / "other.pt", other)
    tokenizers = tiny.bundle.parent  # the tiny fixture's source.model and target.model
    bundle = export_bundle(tmp_path / "other.pt", tokenizers, tmp_path / "other", "other", "0.0.1")
    status, line = run(tiny.bundle, bundle, source, capsys)
    assert status == 1 and "outputs differ" in line
