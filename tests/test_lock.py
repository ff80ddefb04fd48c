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

import pytest
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
    cpu, gpu = installs
    assert "S2S_LOCK=requirements/serve.lock" in cpu
    assert "S2S_LOCK=${GPU_LOCK}" in gpu
    assert "ARG GPU_LOCK=requirements/serve-gpu.lock" in dockerfile
    assert dockerfile.count("COPY requirements/ requirements/") == 2
    script = (REPO / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert '--require-hashes --no-deps -r "$S2S_LOCK"' in script
    assert "--no-deps --no-build-isolation -e ." in script


@pytest.mark.parametrize("name", ["serve-gpu.lock", "serve-gpu-cu12.lock"])
def test_the_gpu_locks_are_the_serving_lock_with_onnxruntime_gpu_and_its_cuda_libraries(
    name: str,
) -> None:
    """scripts/lock_gpu.py's output, checked offline: every pin of serve.lock but onnxruntime is
    there with the same version and hashes; onnxruntime-gpu and NVIDIA's CUDA and cuDNN packages are
    pinned with hashes, in one CUDA major (the one the onnxruntime-gpu release is built for)."""
    cpu = parse_lock(LOCK.read_text())
    gpu = parse_lock((LOCK.parent / name).read_text())
    for package, pin in cpu.items():
        if package != "onnxruntime":
            assert gpu.get(package) == pin, package
    assert "onnxruntime" not in gpu
    extra = {p: pin for p, pin in gpu.items() if p not in cpu}
    assert "onnxruntime-gpu" in extra
    cuda = {p for p in extra if p.startswith("nvidia-")}
    assert {"nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cudnn"} <= {
        p.removesuffix("-cu12").removesuffix("-cu13") for p in cuda
    }
    assert set(extra) == cuda | {"onnxruntime-gpu"}
    for package in extra:
        assert extra[package][1], f"{package} has no hash"
    majors = {extra[p][0].split(".")[0] for p in cuda if "cuda-runtime" in p}
    assert majors == ({"13"} if name == "serve-gpu.lock" else {"12"})


def parse_lock(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name → (version, hashes) of a pip-compile lock."""
    joined = re.sub(r"\\\n", " ", text)
    pins = {}
    for line in joined.splitlines():
        m = re.match(r"^([a-z0-9][a-z0-9._-]*)==(\S+)(.*)$", line.split("#")[0].strip(), re.I)
        if m:
            pins[m.group(1).lower()] = (m.group(2), tuple(re.findall(r"sha256:(\w+)", m.group(3))))
    return pins
