"""Serving dependencies for a host with no package index: packed into parts, installed from them.

    # where pip can reach an index: the lock's wheels for CPython 3.11 and 3.12, Linux x86-64,
    # in parts of at most 45 MB, with a checksum file
    python3 scripts/offline.py pack PARTS [--lock requirements/serve-gpu.lock] [--part-mb 45]

    # on the air-gapped host (any python3 >= 3.11, nothing else needed): check the parts, then
    # install with pip --no-index into a venv, or into a folder for PYTHONPATH
    python3 scripts/offline.py install PARTS --venv .venv
    python3 scripts/offline.py install PARTS --target /opt/s2s-site --only-missing

PARTS holds `wheels.tar.xz.NNN` (the parts), `SHA256SUMS` (of each part) and `manifest.json` (the
lock it was packed from, each wheel's sha256, the Python versions). `install` refuses a part that is
missing or damaged, naming it, before it unpacks anything, and installs with `--require-hashes`
against the lock the parts carry, so a wheel that is not the locked one is refused by pip too.

`--only-missing` is for hosts that already have some of the packages (a PyTorch image has numpy,
onnx, protobuf, grpcio): a locked package is skipped where the host's Python has it at the locked
version or newer, and each skip is listed. `--packages a,b` packs (or installs) a subset of the lock:
the CI test packs two small packages; a host whose image has the heavy ones can carry the rest.
Only the standard library is used, so `install` runs on a bare python3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LOCK = REPO / "requirements" / "serve-gpu.lock"
PYTHONS = ("3.11", "3.12")
# pip matches manylinux tags exactly: the ones the locked wheels are published under
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
ARCHIVE = "wheels.tar.xz"
SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"
MB = 1000 * 1000


class OfflineError(RuntimeError):
    """A pack or an install that cannot go on; the message says what to do."""


@dataclass(frozen=True)
class Pin:
    name: str  # normalized (PEP 503)
    version: str
    hashes: tuple[str, ...]

    def requirement(self) -> str:
        hashes = " ".join(f"--hash=sha256:{h}" for h in self.hashes)
        return f"{self.name}=={self.version} {hashes}".strip()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> list[Pin]:
    """pip-compile's `name==version \\ --hash=sha256:...` entries (comments and markers ignored)."""
    pins: list[Pin] = []
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match:
            hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
            pins.append(Pin(normalize(match.group(1)), match.group(2), hashes))
    if not pins:
        raise OfflineError("the lock pins no package")
    return pins


def select(pins: Sequence[Pin], packages: Sequence[str]) -> list[Pin]:
    """The pins `packages` names (all of them when empty); an unknown name is an error."""
    if not packages:
        return list(pins)
    wanted = {normalize(p) for p in packages}
    unknown = wanted - {p.name for p in pins}
    if unknown:
        raise OfflineError(f"not in the lock: {sorted(unknown)}")
    return [p for p in pins if p.name in wanted]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_requirements(pins: Sequence[Pin], path: Path) -> Path:
    path.write_text("".join(p.requirement() + "\n" for p in pins))
    return path


def download(pins: Sequence[Pin], pythons: Sequence[str], into: Path) -> None:
    """The pinned wheels for each CPython version, checked against the lock's hashes by pip."""
    with tempfile.TemporaryDirectory() as tmp:
        requirements = write_requirements(pins, Path(tmp) / "requirements.txt")
        for python in pythons:
            abi = "cp" + python.replace(".", "")
            platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
            command = [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary=:all:", "--require-hashes", "--implementation", "cp",
                "--python-version", python, "--abi", abi, "--abi", "abi3", "--abi", "none",
                *platforms, "--dest", str(into), "-r", str(requirements),
            ]  # fmt: skip
            if subprocess.run(command).returncode != 0:
                raise OfflineError(f"pip download failed for CPython {python} (see above)")


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """`path` → `path.000`, `path.001`, ... of at most part_bytes each; `path` removed."""
    parts: list[Path] = []
    with path.open("rb") as f:
        while block := f.read(part_bytes):
            part = path.with_name(f"{path.name}.{len(parts):03d}")
            part.write_bytes(block)
            parts.append(part)
    path.unlink()
    return parts


def pack(
    out: Path, lock: Path, packages: Sequence[str], pythons: Sequence[str], part_mb: float
) -> None:
    pins = select(read_lock(lock.read_text()), packages)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise OfflineError(f"{out} is not empty: pack into a new folder")
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        download(pins, pythons, wheels)
        files = sorted(wheels.iterdir())
        wheel_sums = {f.name: sha256(f) for f in files}
        archive = out / ARCHIVE
        with tarfile.open(archive, "w:xz", preset=6) as tar:
            for f in files:
                tar.add(f, arcname=f"wheels/{f.name}")
        parts = split_file(archive, int(part_mb * MB))
    (out / SUMS).write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts))
    manifest = {
        "lock": lock.name,
        "lock_text": lock.read_text(),
        "packages": [p.name for p in pins],
        "pythons": list(pythons),
        "platform": "linux_x86_64",
        "parts": [p.name for p in parts],
        "wheels": wheel_sums,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in parts)
    print(f"{out}: {len(files)} wheels in {len(parts)} parts ({size / MB:.1f} MB), {SUMS}")


def check_parts(parts_dir: Path) -> list[Path]:
    """Every part named in SHA256SUMS present and intact, in order; the problem named otherwise."""
    sums = parts_dir / SUMS
    if not sums.exists():
        raise OfflineError(f"{sums} is missing: copy the whole parts folder")
    parts: list[Path] = []
    for line in sums.read_text().splitlines():
        expected, name = line.split(maxsplit=1)
        part = parts_dir / name.strip()
        if not part.exists():
            raise OfflineError(f"part {part.name} is missing (SHA256SUMS lists it)")
        if sha256(part) != expected:
            raise OfflineError(f"part {part.name} is damaged: its sha256 is not SHA256SUMS's")
        parts.append(part)
    return parts


class Concatenated:
    """The parts read one after another as one file (tarfile's stream mode reads it)."""

    def __init__(self, parts: Sequence[Path]) -> None:
        self.files: Iterator[Path] = iter(parts)
        self.current: BinaryIO | None = None

    def read(self, size: int = -1) -> bytes:
        chunks = []
        while size != 0:
            if self.current is None:
                path = next(self.files, None)
                if path is None:
                    break
                self.current = path.open("rb")
            block = self.current.read(size)
            if not block:
                self.current.close()
                self.current = None
                continue
            chunks.append(block)
            if size > 0:
                size -= len(block)
        return b"".join(chunks)


def unpack(parts: Sequence[Path], into: Path) -> Path:
    with tarfile.open(fileobj=Concatenated(parts), mode="r|xz") as tar:  # type: ignore[call-overload]
        tar.extractall(into, filter="data")
    return into / "wheels"


def installed_versions(python: str, target: Path | None) -> dict[str, str]:
    """Distribution name → version, as `python` sees them (with `target` first on its path)."""
    script = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()"
        " if d.metadata['Name']}))"
    )
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [python, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return {normalize(k): v for k, v in json.loads(out.stdout).items()}


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:4])


def at_least(found: str, locked: str) -> bool:
    return version_key(found) >= version_key(locked)


def plan(
    pins: Sequence[Pin], packed: set[str], host: dict[str, str], only_missing: bool
) -> tuple[list[Pin], list[str]]:
    """Which pins to install, and a line for each one left to the host."""
    install, kept = [], []
    for pin in pins:
        found = host.get(pin.name)
        if only_missing and found is not None and at_least(found, pin.version):
            kept.append(f"{pin.name} {found} (locked {pin.version}): the host's")
        elif pin.name in packed:
            install.append(pin)
        elif found is not None:
            kept.append(f"{pin.name} {found} (locked {pin.version}): not in the parts, the host's")
        else:
            raise OfflineError(
                f"{pin.name}=={pin.version} is neither in the parts nor installed on this host: "
                "pack it (scripts/offline.py pack --packages ...) or install it first"
            )
    return install, kept


def wheel_names(wheels: Path) -> set[str]:
    return {normalize(f.name.split("-")[0]) for f in wheels.glob("*.whl")}


def install(
    parts_dir: Path,
    venv: Path | None,
    target: Path | None,
    only_missing: bool,
    lock_hashes: bool,
    packages: Sequence[str],
) -> None:
    parts = check_parts(parts_dir)
    manifest = json.loads((parts_dir / MANIFEST).read_text())
    pins = select(read_lock(manifest["lock_text"]), packages or manifest["packages"])
    if manifest.get("rebuilt"):  # scripts/slim_cuda_wheel.py's: not the index's bytes
        lock_hashes = False
    if venv is not None:
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
    else:
        python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        wheels = unpack(parts, Path(tmp))
        host = installed_versions(python, target) if only_missing or packages else {}
        chosen, kept = plan(pins, wheel_names(wheels), host, only_missing)
        for line in kept:
            print(f"kept {line}")
        if not chosen:
            print("nothing to install: the host has every locked package")
            return
        requirements = Path(tmp) / "requirements.txt"
        if lock_hashes:
            write_requirements(chosen, requirements)
        else:  # a rebuilt wheel (not the index's): the parts' checksums are the only check
            requirements.write_text("".join(f"{p.name}=={p.version}\n" for p in chosen))
        command = [
            python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
            "--disable-pip-version-check", "--no-compile", "--find-links", str(wheels),
            "-r", str(requirements),
        ]  # fmt: skip
        if lock_hashes:
            command.append("--require-hashes")
        if target is not None:
            target.mkdir(parents=True, exist_ok=True)
            command += ["--target", str(target), "--upgrade"]
        if subprocess.run(command).returncode != 0:
            raise OfflineError("pip could not install from the parts (see above)")
    where = f"venv {venv}" if venv is not None else f"{target} (put it first on PYTHONPATH)"
    print(f"installed {len(chosen)} packages into {where}; kept {len(kept)} of the host's")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    packer = sub.add_parser("pack", help="download the lock's wheels and write the parts")
    packer.add_argument("out", type=Path)
    packer.add_argument("--lock", type=Path, default=DEFAULT_LOCK)
    packer.add_argument("--packages", default="", help="a comma-separated subset of the lock")
    packer.add_argument("--python", nargs="+", default=list(PYTHONS), dest="pythons")
    packer.add_argument("--part-mb", type=float, default=45.0, help="largest part, in MB")
    installer = sub.add_parser("install", help="check the parts and install from them")
    installer.add_argument("parts", type=Path)
    where = installer.add_mutually_exclusive_group(required=True)
    where.add_argument("--venv", type=Path, help="a virtual environment (made if missing)")
    where.add_argument("--target", type=Path, help="a folder to put first on PYTHONPATH")
    installer.add_argument("--only-missing", action="store_true")
    installer.add_argument("--packages", default="", help="a comma-separated subset")
    installer.add_argument(
        "--no-lock-hashes",
        dest="lock_hashes",
        action="store_false",
        help="install wheels whose hashes differ from the lock's (rebuilt ones)",
    )
    args = p.parse_args(argv)
    subset = [s for s in args.packages.split(",") if s]
    try:
        if args.command == "pack":
            pack(args.out, args.lock, subset, args.pythons, args.part_mb)
        else:
            install(args.parts, args.venv, args.target, args.only_missing, args.lock_hashes, subset)
    except OfflineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
