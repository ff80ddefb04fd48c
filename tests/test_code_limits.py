"""The serving code's size limits (issue 65): no file over 700 lines in service/, no class over 450,
no function over 80 except declarations (an argument parser, a set of metrics: at least four in
five of their statements are calls or names bound to calls)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_FILE, MAX_CLASS, MAX_FUNCTION = 700, 450, 80


def service_files() -> list[Path]:
    return sorted(p for p in (REPO / "service").rglob("*.py") if "_pb2" not in p.name)


Sized = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def lines_of(node: Sized) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def declares(statement: ast.stmt) -> bool:
    value = getattr(statement, "value", None)
    return isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign) and isinstance(
        value, ast.Call
    )


def is_declaration(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return bool(body) and 5 * sum(declares(s) for s in body) >= 4 * len(body)


def over_the_limits(path: Path, root: Path = REPO) -> list[str]:
    source = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    found = []
    if source.count("\n") > MAX_FILE:
        found.append(f"{where}: {source.count(chr(10))} lines (at most {MAX_FILE})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and lines_of(node) > MAX_CLASS:
            found.append(f"{where}: class {node.name}, {lines_of(node)} lines")
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and lines_of(node) > MAX_FUNCTION
            and not is_declaration(node)
        ):
            found.append(f"{where}: function {node.name}, {lines_of(node)} lines")
    return found


def test_no_file_class_or_function_of_service_over_its_limit() -> None:
    found = [problem for path in service_files() for problem in over_the_limits(path)]
    assert found == [], "\n".join(found)


def test_the_rule_finds_what_it_is_for(tmp_path: Path) -> None:
    """The check itself: a long function with logic is found, a long declaration is not."""
    logic = "\n".join(f"    if x == {i}:\n        x += {i}" for i in range(45))
    calls = "\n".join(f"    p.add_argument('--a{i}')" for i in range(90))
    big = "\n".join("x = 1" for _ in range(MAX_FILE + 1))
    for name, text in {
        "logic.py": f"def f(x):\n{logic}\n    return x\n",
        "declared.py": f"def parse(p):\n{calls}\n    return p\n",
        "big.py": big + "\n",
    }.items():
        (tmp_path / name).write_text(text)
    found = {
        name: over_the_limits(tmp_path / name, tmp_path)
        for name in ("logic.py", "declared.py", "big.py")
    }
    assert len(found["logic.py"]) == 1 and "function f" in found["logic.py"][0]
    assert found["declared.py"] == []
    assert len(found["big.py"]) == 1 and f"{MAX_FILE + 1} lines" in found["big.py"][0]


def python_files(*folders: str) -> list[str]:
    return sorted(
        str(p)
        for folder in folders
        for p in (REPO / folder).rglob("*.py")
        if "_pb2" not in p.name and ".venv" not in p.parts
    )


def test_no_block_of_twelve_lines_stands_twice_in_service_or_export() -> None:
    """pylint's symilar, over each package: what two places share lives in one of them."""
    symilar = Path(sys.executable).parent / "symilar"
    for folder in ("service", "export"):
        out = subprocess.run(
            [str(symilar), "--duplicates", "12", *python_files(folder)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.rstrip().endswith("duplicates=0 percent=0.00"), out[-3000:]
