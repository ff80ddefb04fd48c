"""Parallel text as the commands read it: a source file and a target file, line for line
(s2s-align, and s2s-client's file mode)."""

from __future__ import annotations

from pathlib import Path


def read_parallel(source: Path, target: Path) -> list[tuple[str, str]]:
    """The two files' lines as pairs; ValueError naming both files when their line counts differ."""
    src = source.read_text(encoding="utf-8").splitlines()
    tgt = target.read_text(encoding="utf-8").splitlines()
    if len(src) != len(tgt):
        raise ValueError(f"{source} has {len(src)} lines but {target} has {len(tgt)}")
    return list(zip(src, tgt, strict=True))
