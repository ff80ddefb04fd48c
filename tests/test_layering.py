"""The architecture's arrows: serving never imports torch or export/, and the stubs match the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
SERVICE_MODULES = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts)
    for p in (REPO / "service").rglob("*.py")
    if p.stem != "__init__"
)
PACKAGES = ("service", "export", "proto", "loadtest", "benchmarks")


def imported_modules(imports: str, prefixes: tuple[str, ...]) -> str:
    """Which modules starting with `prefixes` a fresh interpreter loads for `imports`."""
    code = (
        "import sys\n"
        f"{imports}\n"
        f"print(','.join(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_serving_imports_no_torch_and_no_export() -> None:
    imports = "\n".join(f"import {m}" for m in SERVICE_MODULES)
    bad = imported_modules(imports, ("torch", "export"))
    assert bad == "", f"serving modules pulled in: {bad}"


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    proto = "proto/translation/v1/translation.proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            proto,
        ],
        cwd=REPO,
        check=True,
    )
    for name in ("translation_pb2.py", "translation_pb2_grpc.py"):
        fresh = (tmp_path / "proto/translation/v1" / name).read_text()
        current = (REPO / "proto/translation/v1" / name).read_text()
        assert fresh == current, f"{name} is stale: run scripts/gen_proto.sh"


def test_domain_errors_the_worker_and_the_serving_loop_benchmark_import_no_grpc() -> None:
    """grpc stays at the edges: the status codes are the faces' business (service/serve/status.py)."""
    imports = "import service.decode.shared.errors, service.serve.worker, service.decode.shared.options, benchmarks.serving.serving_loop"
    bad = imported_modules(imports, ("grpc",))
    assert bad == "", f"grpc pulled in: {bad}"


def test_the_jobs_a_front_sends_import_no_onnx_runtime() -> None:
    """A front builds jobs (service/serve/jobs.py) for the engines: plain types, loading neither
    ONNX Runtime nor the engine's runtime (service/decode/runtime/, service/decode/engine/)."""
    runtime = ("onnxruntime", "service.decode.runtime", "service.decode.engine")
    bad = imported_modules("import service.serve.jobs", runtime)
    assert bad == "", f"the jobs pulled in: {bad}"


FRONT_MODULES = (
    "service.serve.grpc_server", "service.serve.grpc_api", "service.serve.http_api",
    "service.serve.translator", "service.serve.mirror", "service.serve.engine_link",
    "service.serve.protocol", "service.serve.repository", "service.decode.engine.text_side",
    "service.decode.requests.marked", "service.decode.requests.recall",
    "service.decode.requests.pipeline", "service.decode.requests.documents",
    "service.decode.align.pair_answers", "service.decode.align.pair_documents",
    "service.model.sentences",
)  # fmt: skip


def test_a_front_process_imports_no_onnx_runtime() -> None:
    """What a front process runs (its faces, the translator over the engines' text sides, the
    request's markup and memory, Align's pairs) loads neither ONNX Runtime nor the engine's
    sessions and device search: those are the engine processes' (Engine over TextSide)."""
    engine_side = ("onnxruntime", "service.decode.runtime.runtime", "service.decode.engine.engine",
                   "service.decode.search.device_search", "service.decode.search.search_memory")  # fmt: skip
    bad = imported_modules("\n".join(f"import {m}" for m in FRONT_MODULES), engine_side)
    assert bad == "", f"a front pulled in: {bad}"


def test_no_import_cycles() -> None:
    """No module reaches itself through its imports (type-checking imports count too): what two
    modules share lives in the lower layer (docs/architecture.md)."""
    graph = grimp.build_graph(*PACKAGES)
    cycles = {
        module: sorted(graph.find_upstream_modules(module) & graph.find_downstream_modules(module))
        for module in sorted(graph.modules)
    }
    assert {m: c for m, c in cycles.items() if c} == {}


def test_import_contracts_hold() -> None:
    """pyproject.toml's import-linter contracts: the layers, no torch in serving, grpc at the edges."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout
