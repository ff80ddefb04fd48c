"""The model shipped inside the package, for installs that have no models/ directory beside them.

A wheel carries models/default as service/models/default (setup.py copies it at build time). A
checkout or the image runs from the project root, where models/default is a plain path; an installed
wheel runs anywhere, so the default `--bundle models/default` would name nothing. `resolve_bundle`
keeps every path that exists as it is and maps only a missing `.../models/<name>` (relative, or the
checkout-relative default of s2s-translate) to the embedded copy of that name.
"""

from __future__ import annotations

from pathlib import Path

EMBEDDED_MODELS = (
    Path(__file__).resolve().parents[1] / "models"
)  # (present in a wheel install only)
REPOSITORY_DEFAULT = "models"  # the server's default --models: the embedded models beside the code


def resolve_bundle(path: str | Path) -> Path:
    """The bundle directory `path` names: itself when it exists, else the embedded `<name>` of a
    missing `.../models/<name>`; a path with no embedded counterpart stays as given (and fails to
    load with a message naming it)."""
    given = Path(path)
    if given.exists() or given.parent.name != "models":
        return given
    embedded = EMBEDDED_MODELS / given.name
    return embedded if embedded.is_dir() else given


def resolve_repository(path: str | Path) -> Path:
    """The model repository `path` names: itself when it exists, else, for the default relative
    `models` of a wheel install run from anywhere, the embedded models inside the package."""
    given = Path(path)
    if given.exists() or str(path) != REPOSITORY_DEFAULT or not EMBEDDED_MODELS.is_dir():
        return given
    return EMBEDDED_MODELS
