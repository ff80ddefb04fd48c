"""Check a GPU host and measure it, in one go: scripts/gpu_check.sh OUT runs this after installing.

    python -m benchmarks.gpu.gpu_check OUT [--short] [--install-s SECONDS]

Stages, each recorded in OUT/gpu_check.json (written after every stage, so a stage that fails or a
run that is stopped keeps what came before) and summed up in OUT/gpu_check.md:

1. providers: the onnxruntime installed, whether the CUDA provider makes a session, and if not why
   (service/decode/runtime/providers.py's diagnosis: the library that did not load, the versions found);
2. placement: every bundle's encoder, decoder-step and search-step graphs (the decoder step with the
   device search appended: service/decode/runtime/search_graph.py), translated through the engine under
   ONNX Runtime's profiler: nodes per provider, any node off CUDA, any Memcpy node;
3. tests: the CUDA-provider tests (skipped on a machine without CUDA) and the provider tests;
4. decode: benchmarks.gpu.decode_loop, static and churn, beam 5, 1 to 256 sentences, on the default
   bundle, the Greek bundle and the realistic configuration, CUDA beside the CPU provider, the numpy
   search beside the device search (judged against issue 43's aims: DEVICE_AIMS) and, on CUDA, the
   device search over the float16 decoder step (RuntimeConfig.fp16_decoder) beside both, with the
   CUDA runtime's own host-to-device bytes (benchmarks/gpu/cuda_copy_counter.so, preloaded) beside
   the ledger's, and the share of each step outside ONNX Runtime's run;
5. served: benchmarks.serving.served on the Greek bundle, the CUDA server then the CPU one, 256 and
   1,024 closed-loop clients, beam 5, with GPU utilization.

Without a GPU the CUDA rows do not run, the report says so, and the exit status is still 0.
`--short` (CI) runs every stage small, on the CPU rows it can.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from benchmarks.gpu import decode_loop
from benchmarks.gpu.placement import profile_bundle
from benchmarks.sample_texts import bundle_texts
from benchmarks.serving import served
from service.decode.runtime.providers import cuda_session_loads, diagnose_cuda

REPO = Path(__file__).resolve().parent.parent.parent
BUNDLES = ("default", "g2p", "grc-en-nt", "grc-en-nt-silver")
TESTS = (
    "tests/test_cuda.py",
    "tests/test_providers.py",
    "tests/test_runtime.py",
    "tests/test_transfers.py",
    "tests/test_copy_counter.py",
)
SERVED_BUNDLE = REPO / "models" / "grc-en-nt"
GPU_BATCHING = "--max-batch-hypotheses 1280 --max-batch-sentences 256"
H2D_TOLERANCE = 0.10  # the aim: the CUDA runtime's host-to-device bytes within 10% of the ledger's
SERVED_AIM = 10.0  # the aim: served sentences/s on CUDA >= 10x the CPU provider's
# issue 43's aims for the device search at 256 sentences x beam 5 on grc-en-nt, on CUDA:
# hypothesis-steps/s static and churn, and the share of a step outside ONNX Runtime's run
DEVICE_AIMS = {"static": 1_000_000.0, "churn": 800_000.0, "outside_run_share": 0.25}


@dataclass(frozen=True)
class Plan:
    """What each stage runs: the full check, or CI's short one."""

    bundles: tuple[str, ...]
    tests: tuple[str, ...]
    decode_models: tuple[str, ...]
    batches: tuple[int, ...]
    steps: int
    served_bundle: Path
    users: tuple[int, ...]
    seconds: float
    warmup_s: float
    timeout_s: float  # per stage run as a subprocess

    @classmethod
    def of(cls, short: bool) -> Plan:
        if short:
            return cls(("default",), TESTS[:2], ("default",), (1, 4), 4,
                       REPO / "models" / "default", (4,), 2.0, 1.0, 300.0)  # fmt: skip
        return cls(BUNDLES, TESTS, ("default", "grc", "realistic"), (1, 4, 16, 64, 256), 30,
                   SERVED_BUNDLE, (256, 1024), 12.0, 4.0, 420.0)  # fmt: skip


class Report:
    """OUT/gpu_check.json, rewritten after every stage."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.data: dict[str, Any] = {"stages": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.started = time.monotonic()

    def stage(self, name: str, run: Any) -> Any:
        print(f"== {name}", flush=True)
        began = time.monotonic()
        try:
            result = run()
            entry = {"ok": True, "result": result}
        except Exception as err:
            entry = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            print(f"   failed: {entry['error']}", flush=True)
        entry["seconds"] = round(time.monotonic() - began, 1)
        self.data["stages"][name] = entry
        self.data["seconds"] = round(time.monotonic() - self.started, 1)
        self.save()
        return entry.get("result")

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1) + "\n")


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = "--query-gpu=name,driver_version,memory.total"
    done = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip() or None


PRELOAD_ONLY = "from service.decode.runtime.providers import cuda_session_loads as f; print(f())"


def preload_alone() -> bool | None:
    """Whether a CUDA session loads in a process that finds CUDA's libraries by
    onnxruntime.preload_dlls alone (the LD_LIBRARY_PATH scripts/gpu_check.sh added taken away);
    None where the script added none."""
    if "S2S_LD_LIBRARY_PATH_BEFORE" not in os.environ:
        return None
    env = dict(os.environ, LD_LIBRARY_PATH=os.environ["S2S_LD_LIBRARY_PATH_BEFORE"])
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_ONLY], cwd=REPO, env=env, capture_output=True, text=True
    )
    return done.stdout.strip().endswith("True")


def providers_stage() -> dict[str, Any]:
    loads = cuda_session_loads()
    return {
        "cuda_session_loads_by_preload_dlls_alone": preload_alone(),
        "onnxruntime": ort.__version__,
        "available": ort.get_available_providers(),
        "cuda_session_loads": loads,
        "diagnosis": asdict(diagnose_cuda()),
        "reason": None if loads else diagnose_cuda().reason(),
        "gpu": gpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def placement_stage(plan: Plan, provider: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in plan.bundles:
        bundle = REPO / "models" / name
        if not (bundle / "manifest.json").exists():
            out[name] = "not here"
            continue
        out[name] = [asdict(g) for g in profile_bundle(bundle, provider, bundle_texts(bundle)[:6])]
    return {"provider": provider, "bundles": out}


def run_logged(
    command: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None
) -> int:
    """Run `command` from the checkout, its output into `log` and echoed; its exit status."""
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        deadline = time.monotonic() + timeout_s
        for line in process.stdout:
            out.write(line)
            print("   " + line, end="", flush=True)
            if time.monotonic() > deadline:
                process.kill()
                raise TimeoutError(f"{command[2]} ran past {timeout_s:.0f} s (see {log.name})")
        return process.wait()


def tests_stage(plan: Plan, out: Path) -> dict[str, Any]:
    xml = out / "tests.xml"
    status = run_logged(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
         *plan.tests], out / "tests.log", plan.timeout_s,
    )  # fmt: skip
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    cuda_ran = [  # tests/test_cuda.py's, and the [cuda] cases of the others
        case.get("name")
        for case in suite.iter("testcase")
        if case.find("skipped") is None
        and (
            (case.get("classname") or "").endswith("test_cuda")
            or "cuda" in (case.get("name") or "").split("[")[-1]
            or "requires_cuda_serves" in (case.get("name") or "")
        )
    ]
    return {
        "exit_status": status,
        "tests": int(suite.get("tests", 0)),
        "failures": int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
        "skipped": int(suite.get("skipped", 0)),
        "failed": failed,
        "cuda_tests_run": len(cuda_ran),
    }


def copy_counter(out: Path) -> Path | None:
    """benchmarks/gpu/cuda_copy_counter.c built with the host's C compiler (None without one)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    library = out / "cuda_copy_counter.so"
    source = REPO / "benchmarks" / "gpu" / "cuda_copy_counter.c"
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"], check=True
    )
    return library


def decode_stage(plan: Plan, out: Path, cuda: bool) -> dict[str, Any]:
    env = dict(os.environ)
    counter = copy_counter(out) if cuda else None
    if counter is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(counter), env.get("LD_PRELOAD")]))
        env["S2S_COPY_COUNTER"] = str(counter)
    report = out / "decode.json"
    # on CUDA the float16 decoder step beside (issue 43: kept where the GPU measures it faster)
    searches = ["host", "device", decode_loop.FP16] if cuda else ["host", "device"]
    status = run_logged(
        [sys.executable, "-m", "benchmarks.gpu.decode_loop", "--models", *plan.decode_models,
         "--batches", *map(str, plan.batches), "--steps", str(plan.steps), "--repeats", "1",
         "--searches", *searches, "--profile", "--json", str(report)],
        out / "decode.log", plan.timeout_s, env,
    )  # fmt: skip
    if not report.exists():
        raise RuntimeError(
            f"benchmarks.gpu.decode_loop exited with {status} before its report (decode.log)"
        )
    result = json.loads(report.read_text())
    result["copy_counter"] = counter is not None
    return result


def layouts(cores: int) -> tuple[str, str]:
    """The served stage's processes (docs/architecture.md, "The processes"): on CUDA one engine
    and a front per 4 cores; on the CPU provider the same fronts and the other cores split between
    engines of 3 ONNX Runtime threads (engines x threads)."""
    fronts = max(1, cores // 4)
    engines = max(1, (cores - fronts) // 3)
    threads = max(1, (cores - fronts) // engines)
    cuda = f"{GPU_BATCHING} --fronts {fronts} --engines 1 --intra-op-threads 1"
    cpu = f"--fronts {fronts} --engines {engines} --intra-op-threads {threads}"
    return cuda, cpu


def served_stage(plan: Plan, out: Path, cuda: bool) -> dict[str, Any]:
    report = out / "served.json"
    providers = ["cuda", "cpu"] if cuda else ["cpu"]
    cuda_flags, cpu_flags = layouts(os.cpu_count() or 1)
    run_logged(
        [sys.executable, "-m", "benchmarks.serving.served", "--bundle", str(plan.served_bundle),
         "--providers", *providers, "--users", *map(str, plan.users),
         "--seconds", str(plan.seconds), "--warmup-s", str(plan.warmup_s),
         "--server-args", f"cuda={cuda_flags}", f"cpu={cpu_flags}", "--json", str(report)],
        out / "served.log", plan.timeout_s,
    )  # fmt: skip
    if not report.exists():
        raise RuntimeError("benchmarks.serving.served wrote no report (served.log)")
    return json.loads(report.read_text())


# --- the Markdown summary ---------------------------------------------------------------------


def verdicts(data: dict[str, Any]) -> list[str]:
    """Each aim of the check, met or not, from what the stages measured."""
    stages = data["stages"]
    lines = []
    placement = (stages.get("placement") or {}).get("result") or {}
    if placement.get("provider") == "cuda":
        graphs = [
            (bundle, g)
            for bundle, found in placement["bundles"].items()
            if isinstance(found, list)
            for g in found
        ]
        off = [
            f"{b} {g['graph']}: {', '.join(g['elsewhere'])}" for b, g in graphs if g["elsewhere"]
        ]
        copies = [f"{b} {g['graph']}: {', '.join(g['memcpy'])}" for b, g in graphs if g["memcpy"]]
        in_step = [c for c in copies if " decoder_step: " in c or " search_step: " in c]
        shapes = sum(len(g["shape_arithmetic"]) for _, g in graphs)
        lines.append(
            "- every computing node on CUDA: "
            + ("**yes**" if not off else "**no**: " + "; ".join(off))
            + f" ({shapes} shape-arithmetic nodes on the CPU, ONNX Runtime's placement)"
        )
        lines.append(
            "- no Memcpy node inside the step: "
            + ("**yes**" if not in_step else "**no**: " + "; ".join(in_step))
            + (
                f"; in the encoder: {'; '.join(c for c in copies if c not in in_step)}"
                if len(copies) > len(in_step)
                else ""
            )
        )
    decode = (stages.get("decode") or {}).get("result") or {}
    ratios = [
        (
            name,
            r["sentences"],
            kind,
            r[kind]["measured_h2d_bytes_per_step"] / r[kind]["h2d_bytes_per_step"],
        )
        for name, rows in decode.get("models", {}).items()
        for r in rows
        if r["provider"] == "cuda"
        for kind in ("static", "churn")
        if r[kind].get("measured_h2d_bytes_per_step") is not None and r[kind]["h2d_bytes_per_step"]
    ]
    if ratios:
        worst = max(ratios, key=lambda x: abs(x[3] - 1))
        within = all(abs(x[3] - 1) <= H2D_TOLERANCE for x in ratios)
        lines.append(
            f"- host-to-device bytes measured / ledger: {min(x[3] for x in ratios):.3f}–"
            f"{max(x[3] for x in ratios):.3f} over {len(ratios)} rows "
            + (
                "(**within 10%**)"
                if within
                else f"(**not within 10%**: worst {worst[0]} B {worst[1]} {worst[2]})"
            )
        )
    lines += device_search_verdicts(decode)
    served_rows = ((stages.get("served") or {}).get("result") or {}).get("rows", [])
    for r in served_rows:
        if r["provider"] == "cuda" and r.get("x_cpu") is not None:
            met = "met" if r["x_cpu"] >= SERVED_AIM else "**not met**"
            lines.append(
                f"- served ×CPU at {r['users']} clients: {r['x_cpu']:.1f} (aim ≥ 10: {met})"
            )
    return lines


def device_search_verdicts(decode: dict[str, Any]) -> list[str]:
    """Issue 43's aims for the device search on CUDA, grc-en-nt at 256 sentences (DEVICE_AIMS),
    and the numpy search's figures of the same run beside them."""
    rows = {
        r.get("search", "host"): r
        for r in decode.get("models", {}).get("grc", [])
        if r["provider"] == "cuda" and r["sentences"] == 256
    }
    device, host, fp16 = rows.get("device"), rows.get("host"), rows.get(decode_loop.FP16)
    if device is None:
        return []
    lines = []
    if fp16 is not None:  # fp16's quality: docs/gpu.md (benchmarks/quality/fp16.py)
        lines.append(
            "- float16 decoder step, grc-en-nt, 256 x 5: "
            + ", ".join(
                f"{kind} {fp16[kind]['hyp_steps_per_s'] / device[kind]['hyp_steps_per_s']:.2f}x "
                "the float32 step's"
                for kind in ("static", "churn")
            )
            + " (keep it where both are above 1)"
        )
    for kind in ("static", "churn"):
        got, aim = device[kind]["hyp_steps_per_s"], DEVICE_AIMS[kind]
        outside = device[kind]["outside_run_share"]
        before = f" (numpy search: {host[kind]['hyp_steps_per_s']:,.0f})" if host else ""
        lines.append(
            f"- device search, grc-en-nt, 256 x 5, {kind}: {got:,.0f} hypothesis-steps/s{before} "
            f"(aim >= {aim:,.0f}: {'met' if got >= aim else '**not met**'}); outside run "
            f"{outside:.0%} (aim <= {DEVICE_AIMS['outside_run_share']:.0%}: "
            f"{'met' if outside <= DEVICE_AIMS['outside_run_share'] else '**not met**'})"
        )
    return lines


def markdown(data: dict[str, Any]) -> str:
    stages = data["stages"]
    prov = (stages.get("providers") or {}).get("result") or {}
    lines = [
        "# GPU check",
        "",
        f"- started {data['started']}, {data.get('seconds', 0):.0f} s in all"
        + (
            f" (install {data['install_s']:.0f} s before it)"
            if data.get("install_s") is not None
            else ""
        ),
        f"- GPU: {prov.get('gpu') or 'none'}; {prov.get('cpus')} CPUs; Python {prov.get('python')}",
        f"- onnxruntime {prov.get('onnxruntime')}: providers {prov.get('available')}",
    ]
    if prov.get("cuda_session_loads"):
        d = prov["diagnosis"]
        lines.append(
            f"- CUDA provider: **loads** (driver for CUDA {d['driver_cuda']}, CUDA runtime "
            f"{d['cuda_runtime']}, cuDNN {d['cudnn']})"
        )
    else:
        lines.append(
            f"- CUDA provider: **did not load**, so the CUDA rows did not run: {prov.get('reason')}"
        )
    lines += ["", "## Aims", "", *(verdicts(data) or ["- (no CUDA rows to judge)"]), ""]
    lines += ["## Stages", "", "| stage | ok | seconds |", "|---|---|---|"]
    lines += [
        f"| {name} | {'yes' if s['ok'] else 'no: ' + s['error']} | {s['seconds']} |"
        for name, s in stages.items()
    ]
    placement = (stages.get("placement") or {}).get("result")
    if placement:
        lines += ["", f"## Node placement ({placement['provider']} asked for)", ""]
        lines += [
            "| bundle | graph | nodes | by provider | computing off the provider | Memcpy "
            "| shape arithmetic on the CPU |",
            "|---|---|---|---|---|---|---|",
        ]
        for bundle, graphs in placement["bundles"].items():
            for g in graphs if isinstance(graphs, list) else []:
                lines.append(
                    f"| {bundle} | {g['graph']} | {g['nodes']} | {g['by_provider']} "
                    f"| {', '.join(g['elsewhere']) or '-'} | {', '.join(g['memcpy']) or '-'} "
                    f"| {len(g['shape_arithmetic'])} |"
                )
    tests = (stages.get("tests") or {}).get("result")
    if tests:
        lines += [
            "",
            "## Tests",
            "",
            f"{tests['tests']} tests, {tests['failures']} failed, {tests['skipped']} skipped; "
            f"CUDA tests run: {tests['cuda_tests_run']}"
            + (f"; failed: {', '.join(tests['failed'])}" if tests["failed"] else ""),
        ]
    decode = (stages.get("decode") or {}).get("result")
    if decode:
        lines += ["", "## Decode loop (benchmarks.gpu.decode_loop, beam 5)", ""]
        for name, rows in decode.get("models", {}).items():
            lines += [f"### {name}", "", *decode_loop.table(rows), ""]
        for name, error in decode.get("errors", {}).items():
            lines.append(f"- {name}: failed: {error}")
        for name, rows in decode.get("profiles", {}).items():
            lines += [
                "",
                f"Where a churn step's time goes ({name}, cProfile):",
                "",
                "```",
                *rows,
                "```",
            ]
    result = (stages.get("served") or {}).get("result")
    if result:
        lines += ["", f"## Served ({Path(result['bundle']).name}, beam 5, closed loop)", ""]
        lines += served.table(result)
        for provider, error in result.get("errors", {}).items():
            lines.append(f"- {provider}: failed: {error.splitlines()[0]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", type=Path)
    p.add_argument("--short", action="store_true", help="CI's: every stage, small")
    p.add_argument("--install-s", type=float, help="how long the install took (the script's)")
    p.add_argument("--skip", nargs="*", default=[], help="stages to leave out")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = Plan.of(args.short)
    report = Report(args.out)
    report.data["short"] = args.short
    report.data["install_s"] = args.install_s
    providers = report.stage("providers", providers_stage) or {}
    cuda = bool(providers.get("cuda_session_loads"))
    stages = {
        "placement": lambda: placement_stage(plan, "cuda" if cuda else "cpu"),
        "tests": lambda: tests_stage(plan, args.out),
        "decode": lambda: decode_stage(plan, args.out, cuda),
        "served": lambda: served_stage(plan, args.out, cuda),
    }
    for name, run in stages.items():
        if name not in args.skip:
            report.stage(name, run)
    (args.out / "gpu_check.md").write_text(markdown(report.data))
    print(markdown(report.data))
    if not cuda:
        print("The CUDA rows did not run: no CUDA provider here (see the providers stage).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
