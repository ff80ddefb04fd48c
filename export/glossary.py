"""Give a bundle a standing glossary (docs/markup.md): a source<TAB>target file of terms, listed and
hashed in its manifest, that every translation of the model keeps (a request can switch it off
with use_glossary = false).

    python -m export.glossary --bundle DIR --entries my-terms.tsv

The file is checked as the server reads it (service/model/glossary.py): a line without a tab, an
empty side, a source the model's input rule refuses or a target its vocabulary cannot spell is
refused, naming the line, before the bundle is changed.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path

from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.model.bundle import add_files

NAME = "glossary.tsv"


def attach(bundle: Path, entries: Path) -> Path:
    """Check the file against the bundle's model, copy it in and list it in the manifest."""
    engine = Engine.load(bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    glossary = engine.terms.read_glossary(entries)  # GlossaryFileError naming the line
    path = bundle / NAME
    shutil.copyfile(entries, path)
    add_files(bundle, [NAME], info={"glossary_terms": len(glossary)}, sections={"glossary": NAME})
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--entries", type=Path, required=True, help="a source<TAB>target file")
    args = p.parse_args(argv)
    path = attach(args.bundle, args.entries)
    print(f"{path}: listed in {args.bundle / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
