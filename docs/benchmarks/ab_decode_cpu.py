"""CPU seconds of benchmarks.decode's variant (a) (128 test sentences, 30 target tokens), before and
after in one process: a previous runtime module loaded from a file beside this one, taking turns.

    git show a0a0af5:service/decode/runtime.py > /tmp/runtime_before.py
    PYTHONPATH=. python docs/benchmarks/ab_decode_cpu.py /tmp/runtime_before.py BEAM ROUNDS

One intra-op thread and no spinning, so `process_time` counts the work and not a spinning pool's
waits; the shared machine's load moves wall time far more than this.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

from benchmarks.decode import onnx_batched
from service.decode.config import RuntimeConfig
from service.decode.runtime import OnnxModel
from service.model.bundle import load_bundle
from service.model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent.parent


def main() -> int:
    base_path, beam, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    spec = importlib.util.spec_from_file_location("base_runtime", base_path)
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    bundle = load_bundle(REPO / "models" / "default")
    config = RuntimeConfig(
        providers=("CPUExecutionProvider",), spin_wait=False, intra_op_threads=1, encoder_threads=1
    )
    models = {"before": base.OnnxModel(bundle, config), "after": OnnxModel(bundle, config)}
    tok = Tokenizer.load(bundle.file("source.model"))
    lines = (REPO / "docs" / "eval" / "test.tsv").read_text().splitlines()[:128]
    sources = [tok.encode(line.split("\t")[0]) for line in lines]
    vocab = bundle.architecture.tgt_vocab_size
    for model in models.values():
        onnx_batched(model, sources, beam, 30, vocab)  # warm-up
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(rounds):
        for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
            started = time.process_time()
            onnx_batched(models[side], sources, beam, 30, vocab)
            seconds[side].append(time.process_time() - started)
    ratios = [a / b for a, b in zip(seconds["after"], seconds["before"], strict=True)]
    print(
        f"beam {beam}: CPU s before {statistics.median(seconds['before']):.3f}, "
        f"after {statistics.median(seconds['after']):.3f}; after/before per round: median "
        f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
