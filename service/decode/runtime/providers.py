"""Which ONNX Runtime execution providers a model runs on, and, when CUDA was asked for and did
not load, why.

By default (`--providers auto`) a model runs on the GPU where a CUDA session can be made, else on
the CPU: one INFO line at start says which and why, and nothing warns, since nobody asked for a GPU.
CUDA named in the providers (a flag, S2S_PROVIDERS, the GPU image) is a request: a model that then
runs on the CPU is worth a warning.

ONNX Runtime falls back to the CPU provider quietly when the CUDA provider's library cannot load (a
CUDA major the wheel was not built for, cuDNN missing): one log line, and a GPU pod serves on its
CPU. `require_provider` turns that into a refusal to start, `diagnose_cuda` into a reason a person
can act on (the missing library named, the CUDA, driver and cuDNN versions found), and a server
that was not told to insist logs the same reason as a warning.

CUDA and cuDNN may come from the system (the CUDA images) or from NVIDIA's pip packages (a PyTorch
image, `onnxruntime-gpu[cuda,cudnn]`): `preload_cuda_libraries` asks ONNX Runtime to load the
latter (`onnxruntime.preload_dlls`, ONNX Runtime 1.21 and later) before the first CUDA session.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort
from onnx import TensorProto, helper

from service.decode.runtime.graph_bytes import graph_bytes
from service.decode.shared.config import AUTO

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
# --require-provider's values: a short name → the provider that must load
REQUIRABLE: dict[str, str] = {"cuda": CUDA}
CUDA_PROVIDER_LIBRARY = "libonnxruntime_providers_cuda.so"
CUDA_MAJORS = (13, 12)  # the CUDA runtimes onnxruntime-gpu has been built for, newest first


class ProviderUnavailable(RuntimeError):
    """A required execution provider did not load; the message says why."""


def resolve_providers(requested: Sequence[str], device_id: int = 0) -> list[str]:
    """auto's choice (`auto_providers`), else the requested providers this onnxruntime build has,
    in order; CPU is always the last resort."""
    if is_auto(requested):
        return list(auto_providers(device_id))
    if CUDA in requested:
        preload_cuda_libraries()
    available = set(ort.get_available_providers())
    chosen = [p for p in requested if p in available]
    dropped = tuple(p for p in requested if p not in available)
    if dropped:
        note_skipped(dropped)
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen


def is_auto(requested: Sequence[str]) -> bool:
    return tuple(requested) == (AUTO,)


@functools.cache
def auto_providers(device_id: int = 0) -> tuple[str, ...]:
    """`--providers auto`: the GPU (CUDA, then the CPU) where a CUDA session loads, else the CPU;
    decided once a process, and said in one INFO line with the reason."""
    if cuda_session_loads(device_id):
        chosen: tuple[str, ...] = (CUDA, CPU)
        why = f"a GPU is usable here: device {device_id}, {diagnose_cuda().found()}"
    else:
        chosen = (CPU,)
        why = f"no usable GPU here: {diagnose_cuda().cause()}"
    log.info(
        "execution provider: %s (auto: the GPU where there is one, else the CPU; %s)",
        chosen[0],
        why,
        extra={"provider": chosen[0]},
    )
    return chosen


@functools.cache
def note_skipped(dropped: tuple[str, ...]) -> None:
    """Once a process: providers named that this build does not have (CUDA's warning says why)."""
    log.info("execution providers not available here, skipped: %s", list(dropped))


@functools.cache
def preload_cuda_libraries() -> str | None:
    """Load CUDA and cuDNN from NVIDIA's pip packages where they are installed (once a process);
    None when done or not needed, else what went wrong (for the diagnosis, never raised: system
    libraries may still serve)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None or CUDA not in ort.get_available_providers():
        return None
    try:
        preload()
    except Exception as err:
        return f"onnxruntime.preload_dlls() failed: {err}"
    return None


@dataclass(frozen=True)
class CudaDiagnosis:
    """What this process can see of the CUDA provider and the libraries it needs."""

    onnxruntime: str  # the installed onnxruntime's version
    build_has_cuda: bool  # this build lists the CUDA provider (onnxruntime-gpu, not onnxruntime)
    load_error: (
        str | None
    )  # the dynamic loader's message for the provider library, naming what is missing
    driver_cuda: str | None  # the newest CUDA the driver supports ("13.0"), None: no driver
    cuda_runtime: str | None  # the CUDA runtime found (libcudart), e.g. "13.0"
    cudnn: str | None  # e.g. "9.14.0"
    preload_error: str | None = None

    def cause(self) -> str:
        """Why the CUDA provider is not in use, in a few words (no advice)."""
        if not self.build_has_cuda:
            return f"this onnxruntime ({self.onnxruntime}) is a build without the CUDA provider"
        if self.load_error:
            return f"the CUDA provider's library did not load: {self.load_error}"
        if self.driver_cuda is None:
            return "no NVIDIA driver found (libcuda.so.1 did not load)"
        return "the CUDA provider loaded but no CUDA session could be created"

    def found(self) -> str:
        return (
            f"found: NVIDIA driver for CUDA {self.driver_cuda or 'none'}, "
            f"CUDA runtime {self.cuda_runtime or 'none'}, cuDNN {self.cudnn or 'none'}"
        )

    def reason(self) -> str:
        """One paragraph: why the CUDA provider is not in use, what to do, and what was found."""
        advice = ""
        if not self.build_has_cuda:
            advice = ": install onnxruntime-gpu instead (requirements/serve-gpu.lock)"
        elif not self.load_error and self.driver_cuda is None:
            advice = ": is a GPU visible here?"
        tail = f"; {self.preload_error}" if self.preload_error else ""
        return f"{self.cause()}{advice} ({self.found()}){tail}"


def cuda_provider_library() -> Path:
    return Path(ort.__file__).parent / "capi" / CUDA_PROVIDER_LIBRARY


def library_load_error(path: Path) -> str | None:
    """The dynamic loader's message for `path` (it names the first dependency it could not find),
    or None when the library loads."""
    try:
        ctypes.CDLL(str(path))
    except OSError as err:
        return str(err)
    return None


def _version_call(sonames: Sequence[str], function: str, with_pointer: bool) -> int | None:
    """Call a `int f(int*)` (with_pointer) or `size_t f(void)` version function of the first
    library of `sonames` that loads."""
    for soname in sonames:
        try:
            lib = ctypes.CDLL(soname)
        except OSError:
            continue
        if with_pointer:
            value = ctypes.c_int(0)
            if getattr(lib, function)(ctypes.byref(value)) == 0:
                return value.value
            continue
        get = getattr(lib, function)
        get.restype = ctypes.c_size_t
        return int(get())
    return None


def cuda_version_text(number: int | None) -> str | None:
    """CUDA's encoding, 1000 × major + 10 × minor (13000 → "13.0")."""
    return None if not number else f"{number // 1000}.{number % 1000 // 10}"


def cudnn_version_text(number: int | None) -> str | None:
    """cuDNN 9's encoding, 10000 × major + 100 × minor + patch (91400 → "9.14.0")."""
    if not number:
        return None
    if number >= 10000:
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"  # cuDNN 8's


def diagnose_cuda() -> CudaDiagnosis:
    preload_error = preload_cuda_libraries()
    build_has_cuda = CUDA in ort.get_available_providers()
    library = cuda_provider_library()
    load_error = None
    if build_has_cuda:
        load_error = library_load_error(library) if library.exists() else f"{library} is missing"
    driver = _version_call(["libcuda.so.1"], "cuDriverGetVersion", with_pointer=True)
    runtime = _version_call(
        [f"libcudart.so.{major}" for major in CUDA_MAJORS], "cudaRuntimeGetVersion", True
    )
    cudnn = _version_call(["libcudnn.so.9", "libcudnn.so.8"], "cudnnGetVersion", False)
    return CudaDiagnosis(
        onnxruntime=ort.__version__,
        build_has_cuda=build_has_cuda,
        load_error=load_error,
        driver_cuda=cuda_version_text(driver),
        cuda_runtime=cuda_version_text(runtime),
        cudnn=cudnn_version_text(cudnn),
        preload_error=preload_error,
    )


def _probe_graph() -> bytes:
    """The smallest graph a provider can run (y = x + x)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    return graph_bytes([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])


@functools.cache
def cuda_session_loads(device_id: int = 0) -> bool:
    """Whether a CUDA session can be created in this process (a probe graph, once)."""
    preload_cuda_libraries()
    if CUDA not in ort.get_available_providers():
        return False
    providers = [CUDA, CPU]
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the fallback is reported by the caller, with its reason
    try:
        session = ort.InferenceSession(
            _probe_graph(),
            sess_options=options,
            providers=providers,
            provider_options=[{"device_id": str(device_id)}, {}],
        )
    except Exception:
        return False
    return session.get_providers()[0] == CUDA


def require_provider(required: str, device_id: int = 0) -> None:
    """Raise ProviderUnavailable, with the reason, unless the provider `required` names loads
    ("" requires nothing)."""
    if not required:
        return
    if required not in REQUIRABLE:
        raise ValueError(f"require_provider must be one of {sorted(REQUIRABLE)} or empty")
    if not cuda_session_loads(device_id):
        raise ProviderUnavailable(
            f"--require-provider {required}: the CUDA execution provider is not available, "
            f"so the server will not start on the CPU. {diagnose_cuda().reason()}"
        )


def check_model_providers(
    name: str, requested: Sequence[str], in_use: Sequence[str], required: str, device_id: int = 0
) -> None:
    """After a model's sessions are made: refuse it if a required provider is not its first,
    and warn (once a process) if CUDA was asked for, or chosen by auto, and the model runs on the
    CPU (auto on a host without a GPU chose the CPU: nothing to warn about)."""
    first = in_use[0] if in_use else CPU
    if required and first != REQUIRABLE[required]:
        raise ProviderUnavailable(
            f"{name}: --require-provider {required}, but the model runs on {first}. "
            f"{diagnose_cuda().reason()}"
        )
    wanted = resolve_providers(requested, device_id) if is_auto(requested) else requested
    if CUDA in wanted and first != CUDA:
        warn_cpu_fallback(name)


@functools.cache
def warn_cpu_fallback(name: str) -> None:
    log.warning(
        "%s: CUDA was requested but the model runs on the CPU provider: %s. "
        "Set --require-provider cuda (S2S_REQUIRE_PROVIDER=cuda) to refuse to start instead.",
        name,
        diagnose_cuda().reason(),
    )
