"""What an int8 decoder graph is, and whether its answers depend on the host's CPU.

Bundles quantize their decoder step with ONNX Runtime's dynamic quantization: activations to
uint8 at run time, weights to int8 ahead of time. On x86-64 CPUs without VNNI (AVX2 or AVX-512
without VNNI: most AMD servers, older Intel ones) ONNX Runtime multiplies uint8 by int8 with
VPMADDUBSW, which adds two products into a 16-bit sum that saturates at 32,767: with weights in
the full int8 range (up to 255 x 127 x 2 = 64,770) the sums clip and the step's scores change.
With VNNI the same products are summed in 32 bits and do not clip, so one such graph answers
differently on different machines (the default model's scores moved by up to 0.49 on an AMD EPYC
with AVX2 against 0.07 on the VNNI machine it was measured on).

The bundles' scheme (export/onnx/quantize.py) keeps every weight within 7 bits,
[-64, 64], one scale per output column: a pair's sum is at most 255 x 64 x 2 = 32,640, so every
kernel sums exactly and the graph answers the same on every CPU. `saturation_risk` reads a graph's
quantized weights to tell the two apart, for graphs made before (or elsewhere).
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

log = logging.getLogger(__name__)

# The largest |weight| whose uint8 x int8 pair sums fit 16 bits: 255 * 64 * 2 = 32,640 <= 32,767.
SAFE_WEIGHT = 64
# Integer matrix products whose second input is the (constant) quantized weight.
INTEGER_PRODUCTS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
# /proc/cpuinfo flags of the instructions that sum uint8 x int8 products in 32 bits.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")

_warned: set[Path] = set()


def saturating_weights(model: onnx.ModelProto) -> list[str]:
    """The int8 weight initializers of `model`'s integer products that reach past 7 bits (whose
    products can saturate a 16-bit pair sum on a CPU without VNNI); [] for a safe graph."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    found: list[str] = []
    for node in model.graph.node:
        if node.op_type not in INTEGER_PRODUCTS or len(node.input) < 2:
            continue
        tensor = initializers.get(node.input[1])
        if tensor is None or tensor.data_type != onnx.TensorProto.INT8:
            continue  # uint8 weights (U8U8) are summed in 32 bits on every CPU
        weights = numpy_helper.to_array(tensor)
        if weights.size and int(np.max(np.abs(weights.astype(np.int16)))) > SAFE_WEIGHT:
            found.append(tensor.name)
    return found


def host_sums_int8_exactly(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU sums uint8 x int8 products without saturating: True off x86-64 (ARM's dot
    products widen) and on x86-64 with VNNI; False on x86-64 without it; None where it cannot tell
    (an x86-64 host without /proc/cpuinfo)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    present = set(flags.partition(":")[2].split())
    return any(flag in present for flag in VNNI_FLAGS)


def saturation_risk(path: Path, exact_host: bool | None = None) -> str | None:
    """A sentence for the operator when the int8 graph at `path` can saturate on this host (weights
    past 7 bits and no VNNI), else None. `exact_host` overrides the host's answer (tests)."""
    exact = host_sums_int8_exactly() if exact_host is None else exact_host
    if exact:
        return None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # a damaged file: loading the session reports it
        return None
    weights = saturating_weights(model)
    if not weights:
        return None
    host = "this CPU has no VNNI" if exact is False else "this CPU's VNNI support is unknown"
    return (
        f"{path}: an int8 graph with weights past 7 bits ({len(weights)} matrices, made before "
        f"the 7-bit scheme or by another tool); {host}, so its 16-bit sums can saturate and its "
        f"answers differ from the same bundle's on a VNNI CPU. Re-quantize it: "
        f"python -m export.onnx.quantize {path.parent}"
    )


def warn_once_if_saturating(path: Path) -> None:
    """Log `saturation_risk`'s sentence once per graph file and process."""
    resolved = path.resolve()
    if resolved in _warned:
        return
    _warned.add(resolved)
    message = saturation_risk(path)
    if message:
        log.warning(message)
