"""An onnxruntime-gpu wheel cut down to one GPU architecture, as parts `scripts/offline.py install`
reads, for moving it where every megabyte counts.

    python scripts/slim_cuda_wheel.py onnxruntime_gpu-1.31.1-cp312-...whl OUT --arch 90 [--part-mb 45]

onnxruntime-gpu 1.31.1's CUDA provider library is 284 MB, 219 MB of it machine code for six GPU
architectures (sm_75, 80, 86, 89, 90, 120) in the library's `.nv_fatbin` section: 609 fatbin
containers of one cubin per architecture. This keeps the `--arch` cubins and writes zeros over the
others' bytes, leaving every header, offset and size as it was, so the CUDA driver still reads the
same containers and picks the cubin it always picked on that GPU (an exact match); a container with
no cubin for `--arch` is kept whole. Zeros compress to nothing: the wheel goes from 255 MB to about
70 MB of xz (sm_90 alone, for the H100/H200). It then runs only on that architecture.

This is not the index's wheel, so its hash is not the lock's: OUT's manifest says `rebuilt`, and
`offline.py install` checks it by the parts' checksums alone. For hosts whose link allows it, pack
the index's wheel (`offline.py pack`) instead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline import ARCHIVE, MANIFEST, MB, SUMS, sha256, split_file

PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
FATBIN_MAGIC = 0xBA55ED50
CONTAINER_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, flags, header size, payload size
ENTRY_ARCH_OFFSET = 28  # uint32 sm_XY as XY


@dataclass(frozen=True)
class Entry:
    container: int
    arch: int
    start: int  # payload offset in the file
    size: int


def fatbin_section(path: Path) -> tuple[int, int]:
    """(file offset, size) of the library's .nv_fatbin section, read with readelf."""
    out = subprocess.run(
        ["readelf", "-S", "-W", str(path)], capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    raise SystemExit(f"{path}: no .nv_fatbin section")


def fatbin_entries(data: bytes | bytearray, offset: int, size: int) -> list[Entry]:
    entries, position, container = [], offset, 0
    end = offset + size
    while position + CONTAINER_HEADER.size <= end:
        magic, _, header_size, payload = CONTAINER_HEADER.unpack_from(data, position)
        if magic != FATBIN_MAGIC:  # alignment padding between containers
            position += 8
            continue
        container += 1
        cursor, container_end = position + header_size, position + header_size + payload
        while cursor < container_end:
            _, _, entry_header, entry_size = ENTRY_HEADER.unpack_from(data, cursor)
            (arch,) = struct.unpack_from("<I", data, cursor + ENTRY_ARCH_OFFSET)
            entries.append(Entry(container, arch, cursor + entry_header, entry_size))
            cursor += entry_header + entry_size
        position = container_end
    return entries


def keep_one_arch(data: bytearray, entries: list[Entry], arch: int) -> int:
    """Zero every cubin of another architecture in containers that have one for `arch`; returns the
    bytes zeroed."""
    with_arch = {e.container for e in entries if e.arch == arch}
    zeroed = 0
    for e in entries:
        if e.container in with_arch and e.arch != arch:
            data[e.start : e.start + e.size] = bytes(e.size)
            zeroed += e.size
    return zeroed


def slim_wheel(wheel: Path, out_wheel: Path, arch: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        source.extractall(tmp)
        library = Path(tmp) / PROVIDER
        offset, size = fatbin_section(library)
        data = bytearray(library.read_bytes())
        entries = fatbin_entries(data, offset, size)
        zeroed = keep_one_arch(data, entries, arch)
        library.write_bytes(data)
        # stored, not deflated: the xz archive around it compresses better
        with zipfile.ZipFile(out_wheel, "w", zipfile.ZIP_STORED) as target:
            for name in names:
                target.write(Path(tmp) / name, name)
    by_arch = Counter[int]()
    for e in entries:
        by_arch[e.arch] += e.size
    return {
        "containers": len({e.container for e in entries}),
        "cubin_bytes_by_arch": {f"sm_{a}": n for a, n in sorted(by_arch.items())},
        "kept_arch": f"sm_{arch}",
        "zeroed_bytes": zeroed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("wheel", type=Path, help="an onnxruntime-gpu wheel from the index")
    p.add_argument("out", type=Path, help="a new folder for the parts")
    p.add_argument("--arch", type=int, required=True, help="the GPU's sm_XY as XY (90: H100/H200)")
    p.add_argument("--part-mb", type=float, default=45.0)
    args = p.parse_args(argv)
    name, version = args.wheel.name.split("-")[:2]
    args.out.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        slim = wheels / args.wheel.name
        report = slim_wheel(args.wheel, slim, args.arch)
        archive = args.out / ARCHIVE
        with tarfile.open(archive, "w:xz", preset=6) as tar:
            tar.add(slim, arcname=f"wheels/{slim.name}")
        wheel_sum = sha256(slim)
        shutil.rmtree(wheels)
    parts = split_file(archive, int(args.part_mb * MB))
    (args.out / SUMS).write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts))
    manifest = {
        "lock": None,
        "lock_text": f"{name.replace('_', '-')}=={version}\n",
        "packages": [name.replace("_", "-")],
        "pythons": [args.wheel.name.split("-")[2]],
        "platform": "linux_x86_64",
        "parts": [p.name for p in parts],
        "wheels": {args.wheel.name: wheel_sum},
        "rebuilt": {"from": args.wheel.name, "from_sha256": sha256(args.wheel), **report},
    }
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in parts)
    print(f"{args.out}: {len(parts)} parts, {total / MB:.1f} MB; {json.dumps(report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
