"""The training console scripts (s2s-train, s2s-evaluate, s2s-export), with a clear word when the
`train` extra is missing.

The serving install (`pip install seq2seq-serve`) installs these scripts too, but not torch,
sacrebleu and the rest; without this, each fails with a bare `ModuleNotFoundError: No module named
'sacrebleu'`. Each script imports its module only when run, and turns a missing training dependency
into one line that says what to install.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

# Top-level import names of the `train` extra in pyproject.toml.
TRAIN_MODULES = frozenset(
    {
        "torch",
        "onnx",
        "onnxscript",
        "sacrebleu",
        "matplotlib",
        "num2words",
        "babel",
        "tqdm",
        "eflomal",
    }
)
INSTALL_HINT = (
    "pip install 'seq2seq-serve[train]' (from a checkout: scripts/install.sh train; "
    "for the CPU-only torch build see the README's install section)"
)


def _run(module: str, script: str) -> int:
    try:
        main: Callable[[], int] = importlib.import_module(module).main
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in TRAIN_MODULES:
            raise
        print(
            f"{script}: needs the training dependencies ({missing} is not installed): {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 2
    return int(main() or 0)


def train() -> int:
    return _run("export.pipeline", "s2s-train")


def evaluate() -> int:
    return _run("export.evaluate.evaluate", "s2s-evaluate")


def export() -> int:
    return _run("export.onnx.to_onnx", "s2s-export")


def align_corpus() -> int:
    return _run("export.align_corpus", "s2s-align-corpus")
