"""Write the GPU locks from requirements/serve.lock: the same pins and hashes, with the CPU
`onnxruntime` replaced by a pinned, hashed `onnxruntime-gpu` (its Linux x86-64 wheels' sha256, read
from the package index's JSON API).

    python scripts/lock_gpu.py                    # both locks, from serve.lock
    python scripts/lock_gpu.py --check            # exit 1 if a lock is not what this would write

Why two, and why their ONNX Runtime versions differ from the CPU lock's 1.32.0 (docs/deploy.md):
onnxruntime-gpu is published later than onnxruntime and only up to 1.31.1 so far, built for CUDA 13
(libcudart.so.13, cuDNN 9; NVIDIA driver 580 or newer). 1.26.0 is the last release built for CUDA 12
(libcudart.so.12, cuDNN 9; driver 525 or newer through CUDA's minor-version compatibility), for GPU
nodes whose driver is older than CUDA 13's. The GPU wheels need what onnxruntime needs
(flatbuffers, numpy, packaging, protobuf), all pinned in serve.lock already.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVE_LOCK = REPO / "requirements" / "serve.lock"
INDEX = "https://pypi.org/simple/onnxruntime-gpu/"
# lock file → (onnxruntime-gpu version, the CUDA it is built for, the driver it needs)
GPU_LOCKS = {
    "serve-gpu.lock": ("1.31.1", "CUDA 13 + cuDNN 9", "NVIDIA driver >= 580"),
    "serve-gpu-cu12.lock": ("1.26.0", "CUDA 12 + cuDNN 9", "NVIDIA driver >= 525"),
}
LINUX_X86_64 = re.compile(r"-cp3\d+t?-manylinux[^/]*x86_64\.whl$")


def wheel_hashes(version: str) -> list[str]:
    """sha256 of every Linux x86-64 CPython wheel of onnxruntime-gpu `version` on the index."""
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    found = sorted(
        f["hashes"]["sha256"]
        for f in files
        if f"-{version}-" in f["filename"] and LINUX_X86_64.search(f["filename"])
    )
    if not found:
        raise SystemExit(f"onnxruntime-gpu {version}: no Linux x86-64 wheel on {INDEX}")
    return found


def gpu_lock(serve_lock: str, version: str, cuda: str, driver: str, hashes: list[str]) -> str:
    """serve.lock's text with its onnxruntime block replaced by onnxruntime-gpu's."""
    block = re.compile(r"^onnxruntime==[^\n]*\n(?:    [^\n]*\n)*", re.MULTILINE)
    if len(block.findall(serve_lock)) != 1:
        raise SystemExit("serve.lock must pin onnxruntime exactly once")
    pins = " \\\n".join(
        [f"onnxruntime-gpu=={version}"] + [f"    --hash=sha256:{h}" for h in hashes]
    )
    replacement = f"{pins}\n    # via seq2seq-serve (the gpu extra: {cuda}, {driver})\n"
    header = (
        f"# GPU serving lock: requirements/serve.lock with onnxruntime replaced by onnxruntime-gpu\n"
        f"# {version} ({cuda}; {driver}). Written by scripts/lock_gpu.py; do not edit by hand.\n"
    )
    return header + block.sub(lambda _: replacement, serve_lock)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
    serve_lock = SERVE_LOCK.read_text()
    stale = []
    for name, (version, cuda, driver) in GPU_LOCKS.items():
        text = gpu_lock(serve_lock, version, cuda, driver, wheel_hashes(version))
        path = SERVE_LOCK.with_name(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
            continue
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}: onnxruntime-gpu=={version} ({cuda})")
    if stale:
        print(f"stale: {stale} (run python scripts/lock_gpu.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
