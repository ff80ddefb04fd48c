"""int8 decoder graphs: ONNX Runtime's dynamic quantization of the step's matrix products, with
weights that every x86-64 CPU sums exactly (service/model/int8.py says why).

    python -m export.onnx.quantize models/default [--scheme s8-channel-7bit]
        # re-make a bundle's decoder.int8.onnx from its decoder.onnx and re-hash it in the
        # manifest (then release it: python -m export.versions --release models/default ...)

The schemes, measured on the default model, grc-en-nt, grc-en-nt-transformer and an OPUS-MT-shape
Transformer (docs/int8.md, benchmarks/quality/int8.py):

- `s8-channel-7bit` (the bundles'): int8 weights within [-64, 64], a scale per output column.
  Exact sums on every CPU; the fastest kernel on every CPU (uint8 x int8: VPMADDUBSW without
  VNNI, VPDPBUSD with it).
- `u8-channel`: uint8 weights, a scale and zero point per column. Exact sums on every CPU too, a
  little closer to fp32 (8 bits), but ONNX Runtime's uint8 x uint8 kernel is the slower one
  (about 0.9x of the above on AVX2, and it cannot use VNNI).
- `s8-tensor-8bit` (bundles before December 2026): full-range int8 weights, one scale a matrix.
  Saturates on x86-64 CPUs without VNNI: kept to measure against, never the default.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from service.model.bundle import add_files, read_manifest
from service.model.int8 import saturating_weights

DEFAULT_SCHEME = "s8-channel-7bit"
SCHEMES: dict[str, dict[str, Any]] = {
    "s8-channel-7bit": {"weight": "int8", "per_channel": True, "reduce_range": True},
    "u8-channel": {"weight": "uint8", "per_channel": True, "reduce_range": False},
    "s8-tensor-8bit": {"weight": "int8", "per_channel": False, "reduce_range": False},
}


def quantize_decoder(decoder_path: Path, out_path: Path, scheme: str = DEFAULT_SCHEME) -> Path:
    """int8 dynamic quantization of the decoder step's matrix products (Gemm and MatMul with a
    constant weight; activations quantized per call to uint8) in `scheme` (SCHEMES)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if scheme not in SCHEMES:
        raise ValueError(f"unknown int8 scheme {scheme!r} (known: {', '.join(SCHEMES)})")
    chosen = SCHEMES[scheme]
    quantize_dynamic(
        str(decoder_path),
        str(out_path),
        weight_type=QuantType.QInt8 if chosen["weight"] == "int8" else QuantType.QUInt8,
        per_channel=chosen["per_channel"],
        reduce_range=chosen["reduce_range"],
        op_types_to_quantize=["MatMul", "Gemm"],
    )
    if scheme != "s8-tensor-8bit":
        wide = saturating_weights(onnx.load(str(out_path)))
        if wide:  # the quantizer changed its ranges: refuse a graph that answers by CPU
            raise RuntimeError(f"{out_path}: weights past 7 bits after {scheme}: {wide[:3]}")
    return out_path


def requantize_bundle(bundle: Path, scheme: str = DEFAULT_SCHEME) -> Path:
    """The bundle's decoder.int8.onnx made anew from its decoder.onnx, and its manifest's hash of
    it updated (its version is the caller's: export/versions.py)."""
    read_manifest(bundle)  # a bundle, or a clear error
    quantize_decoder(bundle / "decoder.onnx", bundle / "decoder.int8.onnx", scheme)
    return add_files(bundle, ["decoder.int8.onnx"], info={"int8_scheme": scheme})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bundle", type=Path, help="a bundle directory with decoder.onnx")
    parser.add_argument("--scheme", choices=sorted(SCHEMES), default=DEFAULT_SCHEME)
    args = parser.parse_args(argv)
    requantize_bundle(args.bundle, args.scheme)
    print(f"{args.bundle / 'decoder.int8.onnx'}: re-made ({args.scheme})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
