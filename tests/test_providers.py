"""The execution provider a model runs on: a server told to require CUDA refuses to start without
it, saying why; one that was not told logs a warning with the same reason when it falls back to the
CPU. Run on the CPU (where this onnxruntime has no CUDA provider, or where its library cannot load)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.harness import free_port
from service.decode import providers
from service.decode.config import RuntimeConfig
from service.decode.engine import Engine
from service.serve.config import load_settings
from tests.conftest import DEFAULT_BUNDLE, REPO, needs_cuda

on_the_cpu = pytest.mark.skipif(
    providers.cuda_session_loads(), reason="CUDA loads here: nothing to refuse"
)


def server(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    return subprocess.run(
        [sys.executable, "-m", "service.serve.server", "--bundle", str(DEFAULT_BUNDLE),
         "--port", "0", "--metrics-port", "-1", "--http-port", "-1", *argv],
        cwd=REPO, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@on_the_cpu
@pytest.mark.parametrize(
    ("argv", "env"),
    [(["--require-provider", "cuda"], {}), ([], {"S2S_REQUIRE_PROVIDER": "cuda"})],
    ids=["flag", "environment"],
)
def test_a_server_that_requires_cuda_refuses_to_start_without_it(
    argv: list[str], env: dict[str, str]
) -> None:
    done = server(argv, env)
    assert done.returncode == 1
    log = done.stdout + done.stderr
    assert (
        "cannot start: --require-provider cuda: the CUDA execution provider is not available" in log
    )
    assert providers.diagnose_cuda().reason() in log  # the reason, with the versions found
    assert "found: NVIDIA driver for CUDA" in log and "cuDNN" in log
    assert '"serving"' not in log


@on_the_cpu
def test_a_fallback_to_the_cpu_logs_a_warning_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    providers.warn_cpu_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="service.decode.providers"):
        engine = Engine.load(
            DEFAULT_BUNDLE, RuntimeConfig(providers=(providers.CUDA, providers.CPU))
        )
    assert engine.model.providers == [providers.CPU]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "CUDA was requested but the model runs on the CPU provider" in warnings[0]
    assert providers.diagnose_cuda().reason() in warnings[0]
    assert "--require-provider cuda" in warnings[0]


def test_a_model_asked_only_for_the_cpu_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    providers.warn_cpu_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="service.decode.providers"):
        Engine.load(DEFAULT_BUNDLE, RuntimeConfig(providers=(providers.CPU,)))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_model_on_the_wrong_provider_is_refused_when_one_is_required() -> None:
    with pytest.raises(
        providers.ProviderUnavailable, match="numbers: --require-provider cuda, but"
    ):
        providers.check_model_providers(
            "numbers", (providers.CUDA, providers.CPU), [providers.CPU], "cuda"
        )
    providers.check_model_providers(  # on CUDA: nothing to say
        "numbers", (providers.CUDA, providers.CPU), [providers.CUDA, providers.CPU], "cuda"
    )


def test_require_provider_is_validated_with_the_runtime_settings() -> None:
    with pytest.raises(ValueError, match="require_provider must be 'cuda' or empty"):
        RuntimeConfig(require_provider="tpu")
    with pytest.raises(ValueError, match="needs CUDAExecutionProvider among the providers"):
        RuntimeConfig(providers=(providers.CPU,), require_provider="cuda")
    settings = load_settings([], {"S2S_REQUIRE_PROVIDER": "cuda"})
    assert settings.runtime.require_provider == "cuda"
    assert load_settings([]).runtime.require_provider == ""


def test_version_numbers_read_as_people_write_them() -> None:
    assert providers.cuda_version_text(13000) == "13.0"
    assert providers.cuda_version_text(12060) == "12.6"
    assert providers.cuda_version_text(None) is None
    assert providers.cudnn_version_text(91400) == "9.14.0"
    assert providers.cudnn_version_text(8907) == "8.9.7"


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_reason_names_the_library_the_provider_could_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider library built against a library that is not there (as onnxruntime-gpu 1.31's
    libcublasLt.so.13 is on a CUDA 12 image; a name no host has, so that a GPU host where CUDA's
    libraries are found runs the test too): the diagnosis names the missing library."""
    (tmp_path / "dep.c").write_text("int cublasLtCreate(void) { return 0; }\n")
    (tmp_path / "provider.c").write_text(
        "int cublasLtCreate(void);\nint provider(void) { return cublasLtCreate(); }\n"
    )
    cc = ["cc", "-shared", "-fPIC", "-o"]
    subprocess.run(
        [*cc, str(tmp_path / "libs2sAbsentCublasLt.so.13"), str(tmp_path / "dep.c"),
         "-Wl,-soname,libs2sAbsentCublasLt.so.13"], check=True,
    )  # fmt: skip
    subprocess.run(
        [*cc, str(tmp_path / "provider.so"), str(tmp_path / "provider.c"),
         str(tmp_path / "libs2sAbsentCublasLt.so.13")], check=True,
    )  # fmt: skip
    (tmp_path / "libs2sAbsentCublasLt.so.13").unlink()
    monkeypatch.setattr(providers, "cuda_provider_library", lambda: tmp_path / "provider.so")
    monkeypatch.setattr(
        providers.ort, "get_available_providers", lambda: [providers.CUDA, providers.CPU]
    )
    found = providers.diagnose_cuda()
    assert found.build_has_cuda and found.load_error is not None
    reason = found.reason()
    assert reason.startswith(
        "the CUDA provider's library did not load: libs2sAbsentCublasLt.so.13: cannot open"
    )
    assert "found: NVIDIA driver for CUDA" in reason


@needs_cuda
def test_a_server_that_requires_cuda_serves_on_it_and_model_info_says_so(tmp_path: Path) -> None:
    import grpc

    from proto.translation.v1 import translation_pb2 as pb
    from proto.translation.v1 import translation_pb2_grpc as pb_grpc
    from tests.conftest import start_server_process, wait_for

    port = free_port()
    process = start_server_process(
        ["--bundle", str(DEFAULT_BUNDLE), "--port", str(port), "--metrics-port", "-1",
         "--http-port", "-1", "--require-provider", "cuda"], tmp_path / "server.log",
    )  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TranslatorStub(channel)

            def answers() -> bool:
                try:
                    stub.GetModelInfo(pb.ModelInfoRequest(), timeout=5)
                except grpc.RpcError:
                    return process.poll() is not None
                return True

            wait_for(answers, "the CUDA server", timeout=120)
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            info = stub.GetModelInfo(pb.ModelInfoRequest(), timeout=5)
            assert info.execution_providers[0] == providers.CUDA
    finally:
        process.terminate()
        process.wait(30)
