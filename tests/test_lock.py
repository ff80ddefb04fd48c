"""requirements/serve.lock (the image's hashed pins) agrees with pyproject.toml: offline, no resolver.

Each serving requirement of pyproject.toml (the dependencies, the `tracing` extra the image installs,
and the build requirements the image builds with) is pinned in the lock at a version it allows,
every pin carries hashes, and every package the lock says comes from pyproject.toml directly is
still asked for there. README.md ("Locked dependencies") says how to refresh the lock.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

LOCK = REPO / "requirements" / "serve.lock"
EXTRAS = ("tracing",)  # the extras the image installs with the dependencies
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
FROM_PYPROJECT = "seq2seq-serve (pyproject.toml"  # pip-compile's "# via" for direct requirements


def wanted(pyproject: Path) -> list[Requirement]:
    """The requirements the lock must satisfy."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = data["project"]
    raw = list(project["dependencies"])
    for extra in EXTRAS:
        raw += project["optional-dependencies"][extra]
    raw += data["build-system"]["requires"]
    return [Requirement(r) for r in raw]


def entries(lock: Path) -> dict[str, tuple[str, str]]:
    """name → (version, the entry's text up to the next pin): pins, hashes and "# via" lines."""
    out: dict[str, tuple[str, str]] = {}
    name = canonicalize_name("")
    for line in lock.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line)
        if match:
            name = canonicalize_name(match.group(1))
            out[name] = (match.group(2), line + "\n")
        elif name and line.startswith(" "):
            version, text = out[name]
            out[name] = (version, text + line + "\n")
    return out


def problems(pyproject: Path, lock: Path) -> list[str]:
    found = entries(lock)
    errors = []
    requirements = wanted(pyproject)
    for req in requirements:
        name = canonicalize_name(req.name)
        if name not in found:
            errors.append(f"{req} is not pinned in {lock.name}")
        elif not req.specifier.contains(found[name][0], prereleases=True):
            errors.append(f"{req} does not allow the locked {name}=={found[name][0]}")
    asked = {canonicalize_name(r.name) for r in requirements}
    for pinned, (version, text) in found.items():
        if "--hash=sha256:" not in text:
            errors.append(f"{pinned}=={version} has no hash")
        if FROM_PYPROJECT in text and pinned not in asked:
            errors.append(
                f"{pinned}=={version} is locked as a direct requirement pyproject.toml no longer has"
            )
    return errors


def test_the_lock_pins_every_serving_requirement_with_hashes() -> None:
    assert problems(REPO / "pyproject.toml", LOCK) == []


def test_the_check_sees_a_drift(tmp_path: Path) -> None:
    """A new dependency, a raised floor and a dropped one are each reported."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"numpy>=1.26",' in text and '"sentencepiece>=0.2",' in text
    drifted = text.replace('"numpy>=1.26",', '"numpy>=99",\n    "left-pad>=1",').replace(
        '"sentencepiece>=0.2",', ""
    )
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(drifted, encoding="utf-8")
    found = problems(pyproject, LOCK)
    assert any(p.startswith("numpy>=99 does not allow") for p in found)
    assert "left-pad>=1 is not pinned in serve.lock" in found
    assert any(p.startswith("sentencepiece==") and "no longer has" in p for p in found)


def test_the_images_install_the_lock_with_hashes() -> None:
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    installs = [
        line
        for line in dockerfile.splitlines()
        if "scripts/install.sh" in line and line.startswith("RUN")
    ]
    assert len(installs) == 2  # the cpu and gpu build stages
    assert all("S2S_LOCK=requirements/serve.lock" in line for line in installs)
    assert dockerfile.count("COPY requirements/ requirements/") == 2
    script = (REPO / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert '--require-hashes --no-deps -r "$S2S_LOCK"' in script
    assert "--no-deps --no-build-isolation -e ." in script
