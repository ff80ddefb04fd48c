"""The wheel runs on its own, and the training scripts say what to install when torch is absent.

The wheel test builds from a clean copy of the checkout (tracked and unignored files only: no
generated stubs, as in a fresh clone), installs the wheel into a fresh venv, and runs the installed
scripts from a directory with no models/ beside them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from export import cli

ROOT = Path(__file__).resolve().parent.parent


def test_training_script_names_the_train_extra_when_a_dependency_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import sacrebleu now fails
    monkeypatch.delitem(sys.modules, "export.train", raising=False)
    assert cli.train() == 2
    err = capsys.readouterr().err
    assert "sacrebleu is not installed" in err and "seq2seq-serve[train]" in err


def test_training_script_errors_of_its_own_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "export.checkpoint", None)  # ours, not a training dependency
    monkeypatch.delitem(sys.modules, "export.to_onnx", raising=False)
    with pytest.raises(ModuleNotFoundError):
        cli.export()


def clean_copy(dest: Path) -> Path:
    """The checkout's tracked and unignored files, as a fresh clone would have them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_wheel_from_a_clean_checkout_serves_and_translates(tmp_path: Path) -> None:
    source = clean_copy(tmp_path / "src")
    assert not list((source / "proto").rglob("*_pb2*.py"))  # the stubs are not in the checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(source)], check=True, env=env
    )
    (wheel,) = (tmp_path / "dist").glob("seq2seq_serve-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    bin_dir = venv / "bin"
    subprocess.run(
        [bin_dir / "python", "-m", "pip", "-q", "install", str(wheel)], check=True, env=env
    )
    elsewhere = tmp_path / "elsewhere"  # no models/ here: the embedded model must be found
    elsewhere.mkdir()

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(bin_dir / args[0]), *args[1:]],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env=env,
            timeout=120,
        )

    helped = run("s2s-serve", "--help")
    assert helped.returncode == 0 and "--bundle" in helped.stdout, helped.stderr
    translated = run("s2s-translate", stdin="seventy-one point five\n")
    assert translated.returncode == 0, translated.stderr
    assert translated.stdout.strip() == "soixante et onze virgule cinq"
    training = run("s2s-train", "--help")  # the serving install has no torch or sacrebleu
    assert training.returncode == 2 and "seq2seq-serve[train]" in training.stderr
