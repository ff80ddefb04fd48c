"""Attention heatmap PNGs (matplotlib, imported only when a picture is asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def save_heatmap_png(
    matrix: np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    path: str | Path,
    title: str = "",
) -> Path:
    """Source tokens on x, target tokens on y, as in the seed texts; weights in [0, 1]."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # serving installs do not need matplotlib
        raise RuntimeError("heatmaps need matplotlib: pip install 'seq2seq-serve[plot]'") from err
    T_y, T_x = matrix.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * T_x + 2), max(3.0, 0.4 * T_y + 1.5)))
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(T_x), list(source_tokens), rotation=90, fontsize=8)
    ax.set_yticks(range(T_y), list(target_tokens), fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
