"""The wheel runs on its own, and the training scripts say what to install when torch is absent.

The wheel test builds from a clean copy of the checkout (tracked and unignored files only: no
generated stubs, as in a fresh clone), installs the wheel into a fresh venv, and runs the installed
scripts from a directory with no models/ beside them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from export import cli
from service.cli.client import parse_args
from tests.test_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_training_script_names_the_train_extra_when_a_dependency_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import sacrebleu now fails
    monkeypatch.delitem(sys.modules, "export.train.train", raising=False)
    monkeypatch.delitem(sys.modules, "export.pipeline", raising=False)
    assert cli.train() == 2
    err = capsys.readouterr().err
    assert "sacrebleu is not installed" in err and "seq2seq-serve[train]" in err


def test_training_script_errors_of_its_own_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "export.train.checkpoint", None
    )  # ours, not a training dependency
    monkeypatch.delitem(sys.modules, "export.onnx.to_onnx", raising=False)
    with pytest.raises(ModuleNotFoundError):
        cli.export()


def test_pyproject_has_no_deprecated_fields() -> None:
    # The `license = { text = ... }` table made every build warn (setuptools >= 77).
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


def test_readme_installs_the_pinned_torch_from_the_cpu_index() -> None:
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [req for req in train["train"] if req.startswith("torch")]
    readme = (ROOT / "README.md").read_text()
    assert f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu" in readme


def test_readme_client_commands_parse() -> None:
    # The README shows the project's client where it showed grpcurl, which nothing installs.
    readme = (ROOT / "README.md").read_text()
    lines = [line.split("#")[0] for line in readme.splitlines() if "-m service.cli.client " in line]
    flags = {"--list-services", "--model-info"}
    for line in lines:
        args = shlex.split(line)[3:]  # after ".venv/bin/python -m service.cli.client"
        parse_args(args)
        flags -= set(args)
    assert not flags, f"the README does not show {flags}"


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
    served = serve_and_list(bin_dir, elsewhere, env)  # the default repository: the embedded models
    assert served == {"numbers-en-fr", "g2p-en-cmudict"}
    training = run("s2s-train", "--help")  # the serving install has no torch or sacrebleu
    assert training.returncode == 2 and "seq2seq-serve[train]" in training.stderr


def serve_and_list(bin_dir: Path, cwd: Path, env: dict[str, str]) -> set[str]:
    """Start the installed s2s-serve with its defaults (the repository `models`, not beside cwd),
    wait for SERVING, and return the names ListModels gives; the server is stopped with SIGTERM."""
    port = free_port()
    log = cwd / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "s2s-serve"), "--port", str(port), "--metrics-port", "-1"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    script = (
        "import sys, time, grpc\n"
        "from proto.translation.v1 import translation_pb2 as pb, translation_pb2_grpc as g\n"
        "stub = g.TranslatorStub(grpc.insecure_channel(sys.argv[1]))\n"
        "for _ in range(240):\n"
        "    try:\n"
        "        models = stub.ListModels(pb.ListModelsRequest(), timeout=2).models\n"
        "        print(' '.join(m.name for m in models)); break\n"
        "    except grpc.RpcError:\n"
        "        time.sleep(0.5)\n"
    )
    try:
        listed = subprocess.run(
            [str(bin_dir / "python"), "-c", script, f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=180,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert listed.returncode == 0, listed.stderr + log.read_text()
    return set(listed.stdout.split())
