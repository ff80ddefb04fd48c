"""scripts/offline.py: the lock's wheels packed into checksummed parts where an index is reachable,
then checked and installed from the parts alone with the network off (a new network namespace
where `unshare` can make one, else an unreachable proxy and no index). CI packs two small packages
of the GPU lock, one of them with a wheel per CPython version, in parts of 40 kB."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

OFFLINE = REPO / "scripts" / "offline.py"
LOCK = REPO / "requirements" / "serve-gpu.lock"
PACKAGES = ("prometheus-client", "propcache")  # pure Python; one wheel per CPython version


def offline(
    *args: str, network: bool = True, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    command = [python, str(OFFLINE), *args]
    env = dict(os.environ)
    if not network:
        env.update(
            PIP_NO_INDEX="1",
            HTTP_PROXY="http://127.0.0.1:9",
            HTTPS_PROXY="http://127.0.0.1:9",
            PIP_FIND_LINKS="",
            PIP_EXTRA_INDEX_URL="",
        )
        if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"]).returncode == 0:
            command = ["unshare", "-rn", *command]  # no network at all
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def locked_version(name: str) -> str:
    for line in LOCK.read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==")[1].split()[0]
    raise AssertionError(name)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "parts"
    done = offline(
        "pack", str(out), "--lock", str(LOCK), "--packages", ",".join(PACKAGES), "--part-mb", "0.04"
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_parts_are_small_checksummed_and_hold_each_python_versions_wheels(parts: Path) -> None:
    manifest = json.loads((parts / "manifest.json").read_text())
    names = manifest["parts"]
    assert len(names) >= 3
    assert all((parts / n).stat().st_size <= 40_000 for n in names)
    sums = dict(line.split()[::-1] for line in (parts / "SHA256SUMS").read_text().splitlines())
    for n in names:
        assert sums[n] == hashlib.sha256((parts / n).read_bytes()).hexdigest()
    wheels = list(manifest["wheels"])
    assert any("cp311" in w for w in wheels) and any("cp312" in w for w in wheels)  # propcache
    assert any(w.startswith("prometheus_client-") for w in wheels)


def test_install_into_a_folder_and_a_venv_with_the_network_off(parts: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    done = offline("install", str(parts), "--target", str(target), network=False)
    assert done.returncode == 0, done.stderr + done.stdout
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import prometheus_client, propcache; print(prometheus_client.__file__)",
        ],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.startswith(str(target))
    venv = tmp_path / "venv"
    done = offline("install", str(parts), "--venv", str(venv), network=False)
    assert done.returncode == 0, done.stderr + done.stdout
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    versions = {
        p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)
    }
    for name in PACKAGES:
        assert versions[name] == locked_version(name)


def test_only_missing_keeps_what_the_host_has(parts: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    assert offline("install", str(parts), "--venv", str(venv), "--packages", "prometheus-client",
                   network=False).returncode == 0  # fmt: skip
    done = offline("install", str(parts), "--venv", str(venv), "--only-missing", network=False)
    assert done.returncode == 0, done.stderr
    assert f"kept prometheus-client {locked_version('prometheus-client')}" in done.stdout
    assert "installed 1 packages" in done.stdout


def copy_parts(parts: Path, to: Path) -> Path:
    shutil.copytree(parts, to)
    return to


def test_a_missing_or_damaged_part_is_named_before_anything_is_installed(
    parts: Path, tmp_path: Path
) -> None:
    damaged = copy_parts(parts, tmp_path / "damaged")
    first = sorted(damaged.glob("wheels.tar.xz.*"))[1]
    first.write_bytes(first.read_bytes()[:-1] + b"\0")
    done = offline("install", str(damaged), "--target", str(tmp_path / "a"), network=False)
    assert done.returncode == 1
    assert f"part {first.name} is damaged" in done.stderr
    assert not (tmp_path / "a").exists()
    missing = copy_parts(parts, tmp_path / "missing")
    last = sorted(missing.glob("wheels.tar.xz.*"))[-1]
    last.unlink()
    done = offline("install", str(missing), "--target", str(tmp_path / "b"), network=False)
    assert done.returncode == 1 and f"part {last.name} is missing" in done.stderr


def test_a_wheel_that_is_not_the_locked_one_is_refused(parts: Path, tmp_path: Path) -> None:
    """Parts rebuilt around an altered wheel, with checksums to match: the lock's hashes refuse it."""
    unpacked = tmp_path / "unpacked"
    data = b"".join(
        (parts / n).read_bytes() for n in json.loads((parts / "manifest.json").read_text())["parts"]
    )
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        tar.extractall(unpacked, filter="data")
    wheel = next((unpacked / "wheels").glob("prometheus_client-*.whl"))
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("prometheus_client/extra.py", "print('not the locked wheel')\n")
    forged = tmp_path / "forged"
    forged.mkdir()
    archive = forged / "wheels.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(unpacked / "wheels", arcname="wheels")
    part = archive.rename(forged / "wheels.tar.xz.000")
    (forged / "SHA256SUMS").write_text(
        f"{hashlib.sha256(part.read_bytes()).hexdigest()}  {part.name}\n"
    )
    manifest = json.loads((parts / "manifest.json").read_text())
    manifest["parts"] = [part.name]
    (forged / "manifest.json").write_text(json.dumps(manifest))
    done = offline("install", str(forged), "--target", str(tmp_path / "site"), network=False)
    assert done.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stdout + done.stderr
