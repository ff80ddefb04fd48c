"""What one answer costs to encode for each face: protobuf bytes (gRPC) against proto3 JSON (HTTP).

    python -m benchmarks.serving.json_mapping [--bundle models/default] [--repeat 200]

Translates the load test's request kinds once with the engine (beam 5, n-best 1, word alignment,
as `loadtest.protocols --alignment word` asks), then times, side by side in one process, the
server's two ways of writing the same TranslateResponse: `SerializeToString` (what grpc sends) and
`service.serve.http_api.to_json` (json_format, what the HTTP face sends), and the client's two ways of
reading it (`FromString`, `json.loads`). Both run on a Python thread that holds the GIL, so on the
server the JSON encoding is taken from the decode loop's time too: this is the per-request cost
behind the HTTP face's overhead under load (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from loadtest import workload
from proto.translation.v1 import translation_pb2 as pb
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.serve.http_api import to_json
from service.serve.protocol import translation_to_pb


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bundle", default="models/default")
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args()
    engine = Engine.load(args.bundle, RuntimeConfig(providers=("CPUExecutionProvider",)))
    sources, _ = workload.load_sources("")
    short, long = workload.split_by_length(sources)
    cases = {"short-b5": short[:1], "long-b5": long[:1], "batch16-b5": sources[:16]}
    print(
        "| request | protobuf bytes | JSON bytes | encode pb µs | encode JSON µs | decode pb µs | json.loads µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, texts in cases.items():
        results = engine.translate(texts, SearchOptions(beam_size=5, n_best=1), alignment="word")
        response = pb.TranslateResponse(
            translations=[translation_to_pb(t) for t in results], request_id="x" * 16
        )
        data, text = response.SerializeToString(), to_json(response)
        row = [
            len(data),
            len(text.encode()),
            per_call_us(response.SerializeToString, args.repeat),
            per_call_us(lambda r=response: to_json(r), args.repeat),  # type: ignore[misc]
            per_call_us(lambda d=data: pb.TranslateResponse.FromString(d), args.repeat),  # type: ignore[misc]
            per_call_us(lambda t=text: json.loads(t), args.repeat),  # type: ignore[misc]
        ]
        print(
            f"| {name} | "
            + " | ".join((f"{v:,}" if isinstance(v, int) else f"{v:,.1f}") for v in row)
            + " |"
        )


if __name__ == "__main__":
    main()
