"""scripts/gpu_check.sh end to end in CI's short mode, on a machine without a GPU: every stage runs
its CPU rows, the report says plainly that the CUDA rows did not run, and the exit status is 0.
And scripts/slim_cuda_wheel.py's fatbin surgery on a synthetic CUDA fatbin."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from service.decode.runtime.providers import cuda_session_loads
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import slim_cuda_wheel as slim


@pytest.mark.skipif(cuda_session_loads(), reason="a GPU host runs the full check instead")
def test_the_short_check_runs_every_stage_and_says_the_cuda_rows_did_not_run(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "out"), "--short"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    stages = report["stages"]
    assert list(stages) == ["providers", "placement", "tests", "decode", "served"]
    assert all(s["ok"] for s in stages.values()), stages
    assert stages["providers"]["result"]["cuda_session_loads"] is False
    assert stages["tests"]["result"]["failures"] == 0
    rows = stages["decode"]["result"]["models"]["default"]
    assert {r["provider"] for r in rows} == {"cpu"} and all(
        r["static"]["hyp_steps_per_s"] > 0 for r in rows
    )
    served = stages["served"]["result"]["rows"]
    assert served and served[0]["provider"] == "cpu" and served[0]["ok"] > 0
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "CUDA provider: **did not load**, so the CUDA rows did not run" in table
    assert "The CUDA rows did not run" in done.stdout


def fatbin(containers: list[list[tuple[int, bytes]]]) -> bytes:
    """A fatbin section: containers of (arch, payload) ELF entries, in the layout CUDA writes."""
    out = b""
    for entries in containers:
        body = b""
        for arch, payload in entries:
            header = bytearray(64)
            struct.pack_into("<HHIQ", header, 0, 2, 0, 64, len(payload))
            struct.pack_into("<I", header, slim.ENTRY_ARCH_OFFSET, arch)
            body += bytes(header) + payload
        out += slim.CONTAINER_HEADER.pack(slim.FATBIN_MAGIC, 1, 16, len(body)) + body
        out += b"\0" * (-len(out) % 8)  # alignment padding between containers
    return out


def test_one_architecture_is_kept_and_the_rest_zeroed_in_place() -> None:
    section = fatbin(
        [
            [(80, b"A" * 40), (90, b"B" * 24), (120, b"C" * 16)],
            [(75, b"D" * 8), (80, b"E" * 8)],  # no sm_90 here: kept whole
        ]
    )
    data = bytearray(b"\xff" * 32 + section)
    entries = slim.fatbin_entries(data, 32, len(section))
    assert [(e.container, e.arch, e.size) for e in entries] == [
        (1, 80, 40), (1, 90, 24), (1, 120, 16), (2, 75, 8), (2, 80, 8)
    ]  # fmt: skip
    before = bytes(data)
    assert slim.keep_one_arch(data, entries, 90) == 40 + 16
    assert len(data) == len(before)  # offsets and sizes unchanged
    payload = {
        e.arch if e.container == 1 else -e.arch: bytes(data[e.start : e.start + e.size])
        for e in entries
    }
    assert payload[90] == b"B" * 24 and payload[80] == bytes(40) and payload[120] == bytes(16)
    assert payload[-75] == b"D" * 8 and payload[-80] == b"E" * 8
    assert data[:32] == before[:32]


def test_the_verdicts_put_the_float16_step_beside_the_float32_one() -> None:
    """On CUDA the decode stage measures the device search over the float16 decoder step too
    (benchmarks.gpu.decode_loop's device-fp16 rows); the report says how fast it is against the
    float32 step, row by row of the same run, and the aims stay the float32 device search's."""
    from benchmarks.gpu import gpu_check

    def row(search: str, static: float, churn: float) -> dict[str, object]:
        figures = {"outside_run_share": 0.2}
        return {
            "provider": "cuda",
            "sentences": 256,
            "search": search,
            "static": {"hyp_steps_per_s": static, **figures},
            "churn": {"hyp_steps_per_s": churn, **figures},
        }

    decode = {
        "models": {
            "grc": [
                row("host", 300e3, 150e3),
                row("device", 1.2e6, 0.7e6),
                row("device-fp16", 1.5e6, 0.63e6),
            ]
        }
    }
    lines = gpu_check.device_search_verdicts(decode)
    assert lines[0] == (
        "- float16 decoder step, grc-en-nt, 256 x 5: static 1.25x the float32 step's, churn 0.90x "
        "the float32 step's (keep it where both are above 1)"
    )
    assert (
        "static: 1,200,000 hypothesis-steps/s (numpy search: 300,000) (aim >= 1,000,000: met)"
        in (lines[1])
    )
    assert "churn: 700,000" in lines[2] and "**not met**" in lines[2]
    decode["models"]["grc"].pop()  # without the float16 rows (a CPU host): no such line
    assert not any("float16" in line for line in gpu_check.device_search_verdicts(decode))
