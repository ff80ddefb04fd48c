"""Exit 0 when the local server's gRPC health service says SERVING (the container HEALTHCHECK).

python -m service.cli.healthcheck [--target 127.0.0.1:50051] [--timeout 3]
"""

from __future__ import annotations

import argparse
import os

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, timeout: float, service: str = "") -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", default=f"127.0.0.1:{os.environ.get('S2S_PORT', '50051')}")
    p.add_argument("--timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    return 0 if check(args.target, args.timeout) else 1


if __name__ == "__main__":
    raise SystemExit(main())
