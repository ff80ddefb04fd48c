"""Write the GPU locks from requirements/serve.lock: the same pins and hashes, with the CPU
`onnxruntime` replaced by a pinned, hashed `onnxruntime-gpu`, and the CUDA and cuDNN libraries it
loads pinned as NVIDIA's pip packages (`onnxruntime-gpu[cuda,cudnn]`, resolved by pip for Linux
x86-64; each wheel's sha256 read from the package index's JSON API). The image then needs nothing of
CUDA from its base: the NVIDIA driver comes from the host, everything else from the lock, and
`onnxruntime.preload_dlls()` loads the libraries (service/decode/runtime/providers.py).

    python scripts/lock_gpu.py                    # both locks, from serve.lock
    python scripts/lock_gpu.py --check            # exit 1 if a lock is not what this would write

Why two, and why their ONNX Runtime versions differ from the CPU lock's 1.32.0 (docs/deploy.md):
onnxruntime-gpu is published later than onnxruntime and only up to 1.31.1 so far, built for CUDA 13
(libcudart.so.13, cuDNN 9; NVIDIA driver 580 or newer). 1.26.0 is the last release built for CUDA 12
(libcudart.so.12, cuDNN 9; driver 525 or newer through CUDA's minor-version compatibility), for GPU
nodes whose driver is older than CUDA 13's. The GPU wheels need what onnxruntime needs
(flatbuffers, numpy, packaging, protobuf), all pinned in serve.lock already. The CUDA 13 lock keeps
the CUDA 13.0 family of libraries (cuDNN 9.19), the combination scripts/gpu_check.sh ran on an
H200 (docs/gpu.md); the CUDA 12 lock takes pip's newest 12.x.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVE_LOCK = REPO / "requirements" / "serve.lock"
# lock file → (onnxruntime-gpu version, the CUDA it is built for, the driver it needs)
GPU_LOCKS = {
    "serve-gpu.lock": ("1.31.1", "CUDA 13 + cuDNN 9", "NVIDIA driver >= 580"),
    "serve-gpu-cu12.lock": ("1.26.0", "CUDA 12 + cuDNN 9", "NVIDIA driver >= 525"),
}
# lock file → constraints on the CUDA libraries pip resolves for onnxruntime-gpu[cuda,cudnn]
CUDA_CONSTRAINTS = {
    "serve-gpu.lock": (
        "nvidia-cuda-runtime==13.0.96",
        "nvidia-cuda-nvrtc==13.0.88",
        "nvidia-nvjitlink==13.0.88",
        "nvidia-cufft<12.1",
        "nvidia-curand<10.4.1",
        "nvidia-cublas<13.2",
        "nvidia-cudnn-cu13==9.19.*",
    ),
    "serve-gpu-cu12.lock": (),
}
LINUX_X86_64 = re.compile(r"-(cp3\d+t?|py3)-[^-]+-manylinux[^/]*x86_64\.whl$")
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
)


def wheel_hashes(name: str, version: str) -> list[str]:
    """sha256 of every Linux x86-64 wheel of `name` `version` on the index."""
    index = f"https://pypi.org/simple/{name}/"
    request = urllib.request.Request(
        index, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    found = sorted(
        f["hashes"]["sha256"]
        for f in files
        if f"-{version}-" in f["filename"] and LINUX_X86_64.search(f["filename"])
    )
    if not found:
        raise SystemExit(f"{name} {version}: no Linux x86-64 wheel on {index}")
    return found


def cuda_libraries(version: str, constraints: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, version) of the NVIDIA packages pip resolves for onnxruntime-gpu[cuda,cudnn]."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "constraints.txt").write_text("".join(c + "\n" for c in constraints))
        report = Path(tmp) / "report.json"
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
             "--only-binary=:all:", *platforms, "--python-version", "3.11",
             "--target", str(Path(tmp) / "target"), "--report", str(report),
             "-c", str(Path(tmp) / "constraints.txt"), f"onnxruntime-gpu[cuda,cudnn]=={version}"],
            check=True,
        )  # fmt: skip
        installs = json.loads(report.read_text())["install"]
    return sorted(
        (i["metadata"]["name"], i["metadata"]["version"])
        for i in installs
        if i["metadata"]["name"].startswith("nvidia-")
    )


def pin(name: str, version: str, hashes: list[str], via: str) -> str:
    lines = [f"{name}=={version}"] + [f"    --hash=sha256:{h}" for h in hashes]
    return " \\\n".join(lines) + f"\n    # via {via}\n"


def gpu_lock(
    serve_lock: str, version: str, cuda: str, driver: str, hashes: list[str], libraries: str
) -> str:
    """serve.lock's text with its onnxruntime block replaced by onnxruntime-gpu's, and the CUDA
    libraries' pins (`libraries`) after it."""
    block = re.compile(r"^onnxruntime==[^\n]*\n(?:    [^\n]*\n)*", re.MULTILINE)
    if len(block.findall(serve_lock)) != 1:
        raise SystemExit("serve.lock must pin onnxruntime exactly once")
    via = f"seq2seq-serve (the gpu extra: {cuda}, {driver})"
    replacement = pin("onnxruntime-gpu", version, hashes, via) + libraries
    header = (
        f"# GPU serving lock: requirements/serve.lock with onnxruntime replaced by onnxruntime-gpu\n"
        f"# {version} ({cuda}; {driver}) and its CUDA libraries as NVIDIA's pip packages.\n"
        f"# Written by scripts/lock_gpu.py; do not edit by hand.\n"
    )
    return header + block.sub(lambda _: replacement, serve_lock)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
    serve_lock = SERVE_LOCK.read_text()
    stale = []
    for name, (version, cuda, driver) in GPU_LOCKS.items():
        libraries = "".join(
            pin(library, v, wheel_hashes(library, v), "onnxruntime-gpu[cuda,cudnn]")
            for library, v in cuda_libraries(version, CUDA_CONSTRAINTS[name])
        )
        text = gpu_lock(
            serve_lock, version, cuda, driver, wheel_hashes("onnxruntime-gpu", version), libraries
        )
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
