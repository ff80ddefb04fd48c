"""Which execution provider ran each node of a bundle's encoder and decoder-step graphs, read from
ONNX Runtime's profiler while the engine translates (beam 5, a running batch, IOBinding: the
serving path itself).

    python -m benchmarks.gpu.placement models/default models/grc-en-nt [--provider cuda] [--json PATH]

For each graph: the nodes per provider, the nodes that did not run on the provider asked for (by
name and operator), and the Memcpy nodes ONNX Runtime inserted (a copy between devices inside the
graph; zero is the aim for the step). The profiler lists the nodes that ran, after ONNX Runtime's
graph optimizations (fused nodes appear under their fused names).

Nodes off the provider are split in two. Shape arithmetic (a node whose every input comes from Shape
nodes and constants: the sizes the exporter computes for Reshape and Slice) is placed on the CPU by
ONNX Runtime on purpose, since shapes live in host memory and the CUDA kernels that take them read
them there: such a node costs no copy. Any other node off the provider is computation on the wrong
device, and is listed as such.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from benchmarks.gpu.decode_loop import PROVIDERS
from benchmarks.sample_texts import bundle_texts
from service.decode.engine.engine import Engine
from service.decode.runtime.providers import CUDA
from service.decode.runtime.sessions import make_session
from service.decode.runtime.step_graph import decoder_graph
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions


@dataclass
class GraphPlacement:
    graph: str
    provider: str  # the provider asked for
    nodes: int = 0  # distinct nodes that ran
    by_provider: dict[str, int] = field(default_factory=dict)
    elsewhere: list[str] = field(default_factory=list)  # computation: "name (op) on provider"
    shape_arithmetic: list[str] = field(default_factory=list)  # "name (op)" on the CPU by design
    memcpy: list[str] = field(default_factory=list)  # Memcpy nodes ONNX Runtime inserted

    @property
    def all_on_provider(self) -> bool:
        return not self.elsewhere and not self.memcpy


def shape_arithmetic(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes whose every input derives from Shape outputs, constants and initializers."""
    graph = model.graph
    derived = {i.name for i in graph.initializer}
    names: set[str] = set()
    for node in graph.node:  # topological order, as ONNX requires
        if node.op_type in ("Shape", "Constant") or (
            node.input and all(i in derived or i == "" for i in node.input)
        ):
            derived.update(node.output)
            names.add(node.name)
    return names


def read_profile(
    path: str | Path,
    graph: str,
    provider: str,
    shapes: Collection[str] = (),
) -> GraphPlacement:
    """The profile's node events → one GraphPlacement (each node counted once, however often it
    ran); `shapes`: the graph's shape-arithmetic nodes (`shape_arithmetic`)."""
    events = json.loads(Path(path).read_text())
    seen: dict[str, tuple[str, str]] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") != "Node" or "provider" not in args:
            continue
        name = event["name"].removesuffix("_kernel_time")
        seen[name] = (args.get("op_name", "?"), args["provider"])
    placement = GraphPlacement(graph, provider, nodes=len(seen))
    placement.by_provider = dict(Counter(p for _, p in seen.values()))
    for name, (op, where) in sorted(seen.items()):
        if op.startswith("Memcpy"):
            placement.memcpy.append(f"{name} ({op}) on {where}")
        elif where != provider and name in shapes:
            placement.shape_arithmetic.append(f"{name} ({op})")
        elif where != provider:
            placement.elsewhere.append(f"{name} ({op}) on {where}")
    return placement


def profile_bundle(bundle: str | Path, provider: str, texts: list[str]) -> list[GraphPlacement]:
    """Translate `texts` with the bundle's encoder, decoder and search sessions profiled: the
    numpy search's decoder step ("decoder_step"), the device search's step graph, the decoder step
    with the search appended ("search_step": service/decode/runtime/search_graph.py); their placements."""
    placements = []
    for search in ("host", "device"):
        config = RuntimeConfig(providers=PROVIDERS[provider], intra_op_threads=1, search=search)
        engine = Engine.load(bundle, config)
        model = engine.model
        with tempfile.TemporaryDirectory() as tmp:
            prefix = str(Path(tmp) / "profile")
            model.encoder = make_session(
                str(model.bundle.file("encoder.onnx")), config, config.encoder_threads, prefix
            )
            graph, _ = decoder_graph(model.decoder_file)
            assert graph is not None
            model.decoder = make_session(graph, config, config.intra_op_threads, prefix)
            model.profile_prefix = prefix
            engine.translate(texts, SearchOptions(beam_size=5, n_best=2), "subword")
            wanted = PROVIDERS[provider][0]
            if search == "host":
                encoder_shapes = shape_arithmetic(onnx.load(str(model.bundle.file("encoder.onnx"))))
                decoder_shapes = shape_arithmetic(onnx.load(str(model.decoder_file)))
                placements += [
                    read_profile(model.encoder.end_profiling(), "encoder", wanted, encoder_shapes),
                    read_profile(
                        model.decoder.end_profiling(), "decoder_step", wanted, decoder_shapes
                    ),
                ]
                continue
            for shape, session in model.search_sessions.items():  # the one a batch of beam 5 ran
                shapes = shape_arithmetic(model.search_graph(shape))
                placements.append(
                    read_profile(session.end_profiling(), "search_step", wanted, shapes)
                )
    return placements


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--provider", choices=list(PROVIDERS), default="cuda")
    p.add_argument("--texts", type=Path, help="one source text a line (default: a few examples)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.provider == "cuda" and CUDA not in ort.get_available_providers():
        print("this onnxruntime has no CUDA provider")
        return 1
    report: dict[str, Any] = {}
    for bundle in args.bundles:
        texts = args.texts.read_text().splitlines()[:8] if args.texts else bundle_texts(bundle)[:8]
        report[str(bundle)] = [asdict(g) for g in profile_bundle(bundle, args.provider, texts)]
        for g in report[str(bundle)]:
            print(
                f"{bundle} {g['graph']}: {g['by_provider']} "
                f"memcpy {g['memcpy']} elsewhere {g['elsewhere']} "
                f"shape arithmetic {len(g['shape_arithmetic'])}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
