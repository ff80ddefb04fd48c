"""s2s-serve: the server's entry point.

    s2s-serve --bundle models/default --port 50051 --metrics-port 9090
    s2s-serve --models /srv/models   # a repository: DIR/NAME/VERSION/ bundles, reloaded on SIGHUP

`main` starts the single-process server (service/serve/grpc_server.py's `serve`), or the
supervisor (service/serve/supervisor.py), or one of the engine and front processes it starts
(`--role`). Each imports only what its own process runs: the supervisor never decodes, and the
decoder's modules and ONNX Runtime, imported, held 127 MiB of its resident memory, a pod's memory
beside its engines' (docs/soak.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from service.serve.config import load_settings
from service.serve.logs import configure_logging
from service.serve.supervisor import die_with_parent, layout, supervise

log = logging.getLogger("s2s.server")


def split_role(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The supervisor's flags for the processes it starts (not settings: no S2S_ variable)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--role", choices=("front", "engine"))
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--channel", default="")
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument("--front-index", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0)
    return parser.parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """s2s-serve: the single-process server (--fronts 0, or one core), else the supervisor and its
    engine and front processes (service/serve/supervisor.py); and those processes themselves."""
    role, rest = split_role(sys.argv[1:] if argv is None else argv)
    if role.role is not None:
        die_with_parent(role.parent)
    try:
        settings = load_settings(rest)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.server.log_level, settings.server.log_format)
    try:
        if role.role == "engine":
            from service.serve.engine_host import run_engine_process

            return run_engine_process(
                settings, role.channel, f"engine-{role.engine_index}", role.run_dir,
                role.engine_index,
            )  # fmt: skip
        if role.role == "front":
            from service.serve.grpc_server import serve_front

            asyncio.run(serve_front(settings, role))
            return 0
        fronts, engines = layout(settings)
        if fronts > 0:
            return supervise(settings, rest, fronts, engines)
        from service.serve.grpc_server import serve

        asyncio.run(serve(settings))
    except Exception as err:  # a bad bundle, a busy port: one clear line, not a traceback
        log.critical("cannot start: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
