"""The benchmark scripts run and report what they measure (their figures are not asserted: timing
belongs in the scripts' output, not in tests), and benchmarks/ keeps its shape: every module
imports, each group's docstring names its modules, no function runs past 80 lines, and
docs/benchmarks/ holds figures, not scripts."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TypeGuard

import pytest

from benchmarks.decoding import decode
from benchmarks.serving import serving_loop
from tests.conftest import REPO, TinyModel

BENCHMARKS = REPO / "benchmarks"
SHARED = {"__init__", "configs", "sample_texts"}  # the top level's modules: the groups' helpers
GROUPS = sorted(p.parent.name for p in BENCHMARKS.glob("*/__init__.py"))
MODULES = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for p in BENCHMARKS.rglob("*.py")
)
LONGEST_FUNCTION = 80  # lines, an argument parser's add_argument calls not counted
OURS = ("service", "export", "proto", "loadtest", "benchmarks", "tests")

# Imports each module named on the command line; prints {module: "ok" | "missing NAME" | traceback}.
# A module that needs a package outside this repository which is not installed (an extra: torch,
# sacrebleu, eflomal, ...) is "missing", anything else that fails is a traceback.
IMPORT_EACH = f"""
import importlib, json, sys, traceback
found = {{}}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        found[name] = "ok"
    except ModuleNotFoundError as e:
        ours = (e.name or "").split(".")[0] in {OURS!r}
        found[name] = traceback.format_exc() if ours else f"missing {{e.name}}"
    except Exception:
        found[name] = traceback.format_exc()
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def imported() -> dict[str, str]:
    """Every benchmark module imported in one fresh interpreter: some set process-wide state at
    import (quality/g2p_en.py the BLAS thread counts), which this test process must not take."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, *MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    found: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmark_module_imports(imported: dict[str, str], module: str) -> None:
    if imported[module].startswith("missing "):
        pytest.skip(f"{module}: {imported[module]} (an optional extra)")
    assert imported[module] == "ok", imported[module]


def test_the_top_level_holds_the_groups_and_their_shared_helpers() -> None:
    flat = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert flat <= SHARED, f"group these by subject: {sorted(flat - SHARED)}"
    assert {"decoding", "serving", "alignment", "quality", "importing", "gpu"} <= set(GROUPS)


@pytest.mark.parametrize("group", GROUPS)
def test_each_group_says_what_its_modules_measure(group: str) -> None:
    folder = BENCHMARKS / group
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    assert doc, f"benchmarks/{group}/__init__.py has no docstring"
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if not re.search(rf"\b{m}\b", doc)] == []


def is_add_argument(node: ast.AST) -> TypeGuard[ast.Call]:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
    )


def function_lengths(path: Path) -> dict[str, int]:
    """Each function's lines (nested ones counted in their parent too), less the lines of its
    `add_argument` calls: an argument parser is a list, not logic."""
    lengths = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            for call in ast.walk(node):
                if is_add_argument(call):
                    lines -= set(range(call.lineno, (call.end_lineno or call.lineno) + 1))
            lengths[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = len(lines)
    return lengths


def test_no_benchmark_function_is_longer_than_80_lines() -> None:
    long = {
        name: n
        for path in sorted(BENCHMARKS.rglob("*.py"))
        for name, n in function_lengths(path).items()
        if n > LONGEST_FUNCTION
    }
    assert long == {}, "split these into named helpers"


def test_docs_benchmarks_holds_figures_not_scripts() -> None:
    scripts = [p for p in (REPO / "docs" / "benchmarks").rglob("*") if p.suffix in {".py", ".sh"}]
    assert scripts == [], "a script belongs under benchmarks/, where lint, types and tests reach it"


class FakeTime:
    """perf_counter/sleep on a clock that only the timed functions move."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_interleaved_timing_takes_turns_and_keeps_each_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeTime()
    monkeypatch.setattr(decode, "time", clock)
    calls: list[str] = []
    durations = {"slow": iter([9.0, 3.0, 2.0, 4.0]), "fast": iter([9.0, 1.0, 2.0, 1.5])}

    def make(name: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            calls.append(name)
            clock.now += next(durations[name])

        return run

    best = decode.best_of_interleaved({"slow": make("slow"), "fast": make("fast")}, repeats=3)
    assert calls == ["slow", "fast"] * 4  # one warm-up each, then three rounds taking turns
    assert best == {"slow": 2.0, "fast": 1.0}  # the warm-up never counts; the pauses never count


def test_serving_loop_benchmark_runs_every_policy_without_errors(
    tiny: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    status = serving_loop.main(
        ["--bundle", str(tiny.bundle), "--users", "4", "--seconds", "1.5", "--mix", "mixed"]
    )
    assert status == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mixed u4")]
    assert [line.split()[2].rstrip(":") for line in lines] == ["none", "request", "iteration"]
    for line in lines:
        match = re.search(r"([\d.]+) sentences/s.*?(\d+) requests, (\d+) errors", line)
        assert match is not None, line
        assert float(match[1]) > 0 and int(match[2]) > 0 and int(match[3]) == 0
