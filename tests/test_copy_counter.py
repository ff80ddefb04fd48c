"""benchmarks/gpu/cuda_copy_counter.c, preloaded before a stand-in CUDA runtime: the copies a
library makes through libcudart's symbols are counted by direction and still happen, and
benchmarks.gpu.decode_loop reads the counts. (On a GPU host the library is onnxruntime-gpu's CUDA
provider and the runtime is CUDA's; scripts/gpu_check.sh sets the counts beside the transfer
ledger's.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

# A stand-in libcudart: copies are memcpy, and "device memory" is one static buffer
FAKE_CUDART = r"""
#include <string.h>
#include <stddef.h>
static char device_memory[1 << 16];
struct attributes { int type; int device; void *device_pointer; void *host_pointer; };
static int on_device(const void *p) {
  return (const char *)p >= device_memory && (const char *)p < device_memory + sizeof device_memory;
}
void *fake_device_memory(void) { return device_memory; }
int cudaMemcpy(void *d, const void *s, size_t n, int kind) { memcpy(d, s, n); return 0; }
int cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, void *stream) {
  memcpy(d, s, n); return 0;
}
int cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, int kind,
                      void *stream) {
  for (size_t r = 0; r < h; r++) memcpy((char *)d + r * dp, (const char *)s + r * sp, w);
  return 0;
}
int cudaPointerGetAttributes(struct attributes *a, const void *p) {
  a->type = on_device(p) ? 2 : 0; return 0;
}
"""
# A library calling the runtime through its dynamic symbols, as onnxruntime's provider does
CALLER = r"""
#include <stddef.h>
int cudaMemcpy(void *, const void *, size_t, int);
int cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int cudaMemcpy2DAsync(void *, size_t, const void *, size_t, size_t, size_t, int, void *);
int copy(void *d, const void *s, size_t n, int kind) { return cudaMemcpyAsync(d, s, n, kind, 0); }
int copy_sync(void *d, const void *s, size_t n, int kind) { return cudaMemcpy(d, s, n, kind); }
int copy_2d(void *d, const void *s, size_t w, size_t h, int kind) {
  return cudaMemcpy2DAsync(d, w, s, w, w, h, kind, 0);
}
"""
SCRIPT = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
from benchmarks.gpu.decode_loop import COUNTER
caller = ctypes.CDLL(sys.argv[2])
fake = ctypes.CDLL(sys.argv[3])
fake.fake_device_memory.restype = ctypes.c_void_p
device = fake.fake_device_memory()
host = ctypes.create_string_buffer(b"x" * 4096)
before = COUNTER.snapshot()
caller.copy(ctypes.c_void_p(device), host, ctypes.c_size_t(1000), 1)  # host to device
caller.copy_sync(ctypes.c_void_p(device), host, ctypes.c_size_t(24), 4)  # default: resolved
caller.copy_2d(ctypes.c_void_p(device), host, ctypes.c_size_t(10), ctypes.c_size_t(3), 1)
back = ctypes.create_string_buffer(16)
caller.copy(back, ctypes.c_void_p(device), ctypes.c_size_t(16), 2)  # device to host, not counted
after = COUNTER.snapshot()
print(json.dumps({"h2d": [after[0] - before[0], after[1] - before[1]], "back": back.raw.decode()}))
"""


def build(tmp: Path) -> tuple[Path, Path, Path]:
    (tmp / "cudart.c").write_text(FAKE_CUDART)
    (tmp / "caller.c").write_text(CALLER)
    cudart, caller, counter = tmp / "libcudart.so.13", tmp / "caller.so", tmp / "counter.so"
    shared = ["cc", "-O1", "-shared", "-fPIC"]
    subprocess.run(
        [*shared, "-o", str(cudart), str(tmp / "cudart.c"), "-Wl,-soname,libcudart.so.13"],
        check=True,
    )
    subprocess.run([*shared, "-o", str(caller), str(tmp / "caller.c"), str(cudart)], check=True)
    source = REPO / "benchmarks" / "gpu" / "cuda_copy_counter.c"
    subprocess.run([*shared, "-o", str(counter), str(source), "-ldl"], check=True)
    return cudart, caller, counter


def test_preloaded_counter_counts_host_to_device_bytes_and_the_copies_still_happen(
    tmp_path: Path,
) -> None:
    cudart, caller, counter = build(tmp_path)
    env = {
        **os.environ,
        "LD_PRELOAD": str(counter),
        "S2S_COPY_COUNTER": str(counter),
        "LD_LIBRARY_PATH": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO), str(caller), str(cudart)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["h2d"] == [1000 + 24 + 30, 3]  # the device-to-host copy is not among them
    assert result["back"] == "x" * 16  # forwarded to the real (here: stand-in) runtime


def test_without_the_counter_preloaded_the_benchmark_reports_no_measured_bytes() -> None:
    from benchmarks.gpu.decode_loop import CopyCounter

    assert "LD_PRELOAD" not in os.environ or "cuda_copy_counter" not in os.environ["LD_PRELOAD"]
    assert CopyCounter().snapshot() is None
