"""The execution provider a model runs on: by default the GPU where there is one, else the CPU, said
once at start in one INFO line with the reason; a server told to require CUDA refuses to start
without it, saying why; one asked for CUDA explicitly (a flag, the environment, the GPU image) logs a
warning with the same reason when it falls back to the CPU. Run on the CPU (where this onnxruntime
has no CUDA provider, or where its library cannot load)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.harness import free_port
from service.decode.engine.engine import Engine
from service.decode.runtime import providers
from service.decode.shared.config import RuntimeConfig
from service.serve.config import load_settings
from tests.conftest import DEFAULT_BUNDLE, REPO, needs_cuda, start_server_process, wait_for

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
    with caplog.at_level(logging.WARNING, logger="service.decode.runtime.providers"):
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
    with caplog.at_level(logging.WARNING, logger="service.decode.runtime.providers"):
        Engine.load(DEFAULT_BUNDLE, RuntimeConfig(providers=(providers.CPU,)))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@on_the_cpu
def test_a_host_without_a_gpu_starts_on_the_cpu_with_one_line_that_says_why(
    tmp_path: Path,
) -> None:
    """scripts/serve.sh's server with nothing asked for: every embedded model on the CPU, no warning,
    and one INFO line (not one per model or per session) that says which provider and why."""
    log = tmp_path / "server.log"
    argv = ["--models", str(REPO / "models"), "--port", str(free_port()), "--metrics-port", "-1",
            "--http-port", "-1", "--no-warmup", "--reload-interval-s", "0"]  # fmt: skip
    process = start_server_process(argv, log)
    try:
        wait_for(
            lambda: '"serving"' in log.read_text() or process.poll() is not None,
            "the server to start",
            timeout=120,
        )
    finally:
        process.terminate()
        process.wait(30)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(line["message"] == "serving" for line in lines), log.read_text()
    loaded = [line["model"] for line in lines if line["message"] == "model version loaded"]
    assert len(loaded) == len([p for p in (REPO / "models").iterdir() if p.is_dir()])
    assert [line for line in lines if line["level"] not in ("INFO", "DEBUG")] == []
    said = [line for line in lines if line["logger"] == "service.decode.runtime.providers"]
    assert len(said) == 1, said
    assert said[0]["level"] == "INFO" and said[0]["provider"] == providers.CPU
    assert said[0]["message"].startswith("execution provider: CPUExecutionProvider (auto:")
    assert providers.diagnose_cuda().cause() in said[0]["message"]


@on_the_cpu
def test_s2s_translate_answers_on_a_cpu_host_without_a_word_on_stderr() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("S2S_")}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli.translate", "--bundle", str(DEFAULT_BUNDLE)],
        input="seventy-one\n", cwd=REPO, env=clean, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and done.stderr == ""


def test_the_default_is_the_gpu_where_there_is_one_and_naming_cuda_asks_for_it() -> None:
    assert load_settings([]).runtime.providers == ("auto",)
    assert RuntimeConfig().providers == ("auto",)
    expected = (
        [providers.CUDA, providers.CPU] if providers.cuda_session_loads() else [providers.CPU]
    )
    assert providers.resolve_providers(("auto",)) == expected
    explicit = load_settings([], {"S2S_PROVIDERS": "CUDAExecutionProvider,CPUExecutionProvider"})
    assert explicit.runtime.providers == (providers.CUDA, providers.CPU)
    RuntimeConfig(require_provider="cuda")  # auto may be required to find CUDA
    with pytest.raises(ValueError, match="auto stands alone"):
        RuntimeConfig(providers=("auto", providers.CPU))


@on_the_cpu
def test_a_model_left_to_auto_on_a_cpu_host_warns_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    providers.warn_cpu_fallback.cache_clear()
    with caplog.at_level(logging.INFO, logger="service.decode.runtime.providers"):
        engine = Engine.load(DEFAULT_BUNDLE, RuntimeConfig())
    assert engine.model.providers == [providers.CPU]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@on_the_cpu
def test_a_model_left_to_auto_is_refused_on_a_cpu_host_when_cuda_is_required() -> None:
    with pytest.raises(providers.ProviderUnavailable, match="--require-provider cuda, but"):
        Engine.load(DEFAULT_BUNDLE, RuntimeConfig(require_provider="cuda"))


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
