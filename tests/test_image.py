"""The cpu image builds and runs: scripts/image_smoke.sh with podman, where podman is installed.

The script builds the base image from Debian packages (once, then cached in podman's store), builds
the cpu target, runs it, checks gRPC health SERVING as uid 10001, translates through the port with
the project's client and stops the container with SIGTERM (exit status 0). About 2 minutes the first
time (debootstrap), under a minute after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_server import free_port

TOOLS = ("podman", "debootstrap", "runc")


@pytest.mark.slow
@pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS) or os.geteuid() != 0,
    reason="needs root and podman, debootstrap and runc (apt-get install podman debootstrap runc)",
)
def test_the_cpu_image_serves_as_non_root_and_stops_on_sigterm() -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "S2S_SMOKE_PORT": str(free_port()),
        "S2S_SMOKE_METRICS_PORT": str(free_port()),
    }
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "image_smoke.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "health: SERVING (checked as uid 10001)" in out
    assert "-> soixante et onze virgule cinq" in out
    assert "SIGTERM: exited with status 0" in out
