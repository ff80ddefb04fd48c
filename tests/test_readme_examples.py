"""The README's Greek examples show what the model answers: each `service.cli.client` command on
`grc-en-nt` with a text is followed by its output as comment lines, and those lines are what the
client prints for the embedded model with the server's defaults (rendered here without a server:
the engine, the bundle's defaults and the client's own formatting). A newcomer's first call is the
plain one, so it shows its answer too, repetition and all."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import replace
from typing import Any

import pytest

from service.cli import client
from service.decode.engine.engine import Engine
from service.decode.requests import in_process
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions, merge_options, options_from_args
from tests.conftest import REPO

README = REPO / "README.md"
ANNOTATION = re.compile(r"\s{2,}\(.*\)$")  # "   (the next word, ...)": a note, not output


def examples() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of each grc-en-nt client command with a text."""
    lines = README.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        if "-m service.cli.client" not in line or "--model grc-en-nt" not in line:
            continue
        if "--source-file" in line or '"' not in line:
            continue
        shown = []
        for after in lines[i + 1 :]:
            if not after.startswith("# "):
                break
            shown.append(ANNOTATION.sub("", after[2:]).rstrip())
        out.append((line, shown))
    return out


@pytest.fixture(scope="module")
def engine() -> Engine:
    cpu = RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1)
    return Engine.load(REPO / "models" / "grc-en-nt", cpu)


def test_the_first_greek_example_shows_its_answer() -> None:
    found = examples()
    assert len(found) >= 3
    command, shown = found[0]
    assert "--no-repeat-ngram-size" not in command and "--target-prefix" not in command
    assert shown, f"the README's first Greek example shows no answer: {command}"


@pytest.mark.parametrize("index", range(3))
def test_each_greek_example_shows_what_the_model_answers(engine: Engine, index: int) -> None:
    command, shown = examples()[index]
    args = client.parse_args(shlex.split(command)[3:])
    defaults = {**SearchOptions().values(), **engine.decoding_defaults}  # as the server's
    options = SearchOptions(**merge_options(defaults, options_from_args(args)))
    if options.target_prefix:  # the client sends its one prefix for every text
        options = replace(options, target_prefix=options.target_prefix[:1] * len(args.texts))
    translations = in_process.translate_with_memory(engine, args.texts, options, "none")
    text_only = argparse.Namespace(**{**vars(args), "align": None})  # no Pharaoh, no heatmap
    shape: Any = translations[0]  # the engine's Translation: the client's fields, same names
    printed = client.format_translation(shape, text_only).splitlines()
    assert printed[: len(shown)] == shown
