"""Build steps pyproject.toml cannot declare: the gRPC stubs and the embedded model.

A wheel must run on its own (`pip wheel .` from a clean checkout, then `s2s-serve --help`), so the
build generates proto/translation/v1's *_pb2*.py stubs from the .proto (grpcio-tools, a build
requirement) and copies the shipped bundle models/default into the package as service/models/default,
where `service.model.embedded.resolve_bundle` finds it when no models/ directory is next to the caller.
The stubs are generated rather than committed because their code is tied to the protobuf version
that generated them: generated at build time, they match the grpcio-tools the build resolves.
In an editable install the stubs are written into the source tree instead (as scripts/gen_proto.sh
does) and the model is read from models/ where it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = "proto/translation/v1/translation.proto"
EMBEDDED_MODELS = ("default", "g2p")  # models/<name> → service/models/<name> in the wheel


def generate_stubs(out: Path) -> None:
    """translation.proto → translation_pb2.py, _pb2_grpc.py and _pb2.pyi under out/proto/translation/v1."""
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).parent / "_proto")  # the well-known types
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
    ]
    if protoc.main([*args, f"--pyi_out={out}", str(ROOT / PROTO)]) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")


class BuildPyWithStubsAndModels(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            generate_stubs(ROOT)
            return
        build_lib = Path(self.build_lib)
        generate_stubs(build_lib)
        for name in EMBEDDED_MODELS:
            target = build_lib / "service" / "models" / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(ROOT / "models" / name, target)


setup(cmdclass={"build_py": BuildPyWithStubsAndModels})
