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

from service.decode.providers import cuda_session_loads
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
