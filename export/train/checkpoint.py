"""Checkpoints: weights plus the architecture config, loaded safely (weights_only=True); and a
run's training state (weights, optimizer, counters) for --resume."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from export.train.model import Seq2Seq
from service.model.architecture import ModelConfig


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or not one of ours."""


def save_checkpoint(path: Path, model: Seq2Seq, extra: dict[str, Any] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": model.cfg.to_dict(), "model": model.state_dict(), "extra": extra or {}}
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)  # never leave a half-written checkpoint under the real name


def load_checkpoint(path: str | Path) -> tuple[Seq2Seq, dict[str, Any]]:
    """Load a checkpoint into a fresh model in eval mode; returns the model and the extra metadata."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"cannot read checkpoint {path}: {type(err).__name__}: {err}"
        ) from err
    if not isinstance(payload, dict) or "config" not in payload or "model" not in payload:
        raise CheckpointError(
            f"{path} is not a seq2seq checkpoint (expected keys 'config' and 'model')"
        )
    try:
        cfg = ModelConfig.from_dict(dict(payload["config"]))
        model = Seq2Seq(cfg)
        model.load_state_dict(payload["model"])
    except (ValueError, RuntimeError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} does not match its config: {err}") from err
    model.eval()
    return model, dict(payload.get("extra", {}))


@dataclass(frozen=True)
class TrainingState:
    """What --resume needs beyond best.pt: the latest weights, the optimizer's moments and the
    run's counters (export/train/train.py's Progress, as a dict)."""

    config: dict[str, Any]
    model: dict[str, Any]
    optimizer: dict[str, Any]
    progress: dict[str, Any]


def save_training_state(
    path: Path, model: Seq2Seq, optimizer: torch.optim.Optimizer, progress: dict[str, Any]
) -> None:
    """Write the run's latest state (replacing the previous one only once fully written)."""
    payload = {
        "config": model.cfg.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "progress": progress,
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def load_training_state(path: Path) -> TrainingState:
    """Read a state written by save_training_state (CheckpointError when it is not one)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"cannot read training state {path}: {type(err).__name__}: {err}"
        ) from err
    keys = ("config", "model", "optimizer", "progress")
    if not isinstance(payload, dict) or any(k not in payload for k in keys):
        raise CheckpointError(f"{path} is not a training state (expected keys {keys})")
    return TrainingState(**{k: payload[k] for k in keys})
