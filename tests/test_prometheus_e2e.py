"""End to end: a real Prometheus (Debian's package) scrapes a real server under a short locust load,
evaluates deploy/monitoring/rules.yml, and one recording rule is queried back over its HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from loadtest.harness import free_port, is_serving
from tests.conftest import REPO, TinyModel

RULES = REPO / "deploy" / "monitoring" / "rules.yml"
RULE = "job_method:s2s_requests:rate5m"


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed: .ci/run installs Debian's prometheus package")
        pytest.skip(f"{tool} not installed (apt-get install prometheus)")
    return path


def wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def query(prometheus_port: int, promql: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?" + urllib.parse.urlencode(
        {"query": promql}
    )
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.slow
def test_prometheus_scrapes_the_server_and_evaluates_a_recording_rule(
    tiny: TinyModel, tmp_path: Path
) -> None:
    prometheus = require("prometheus")
    grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "service.serve.server", "--bundle", str(tiny.bundle), "--host", "127.0.0.1",
         "--port", str(grpc_port), "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
         "--providers", "CPUExecutionProvider", "--log-level", "WARNING"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: s2s\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    prom = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(
            lambda: is_serving(f"127.0.0.1:{grpc_port}", 1.0), 60, "the server to be SERVING"
        )
        wait_until(lambda: query_ok(prom_port, "up"), 30, "Prometheus to answer")
        load = subprocess.run(
            [sys.executable, "-m", "loadtest.run", "--target", f"127.0.0.1:{grpc_port}", "--users", "3",
             "--duration", "6s", "--out", str(tmp_path / "load"), "--metrics-url",
             f"http://127.0.0.1:{metrics_port}/metrics"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert load.returncode == 0, load.stdout + load.stderr
        assert query(prom_port, 'up{job="s2s"}')[0]["value"][1] == "1"  # type: ignore[index]

        def rule_has_traffic() -> bool:
            rows = query(prom_port, f'{RULE}{{method="Translate"}}')
            return bool(rows) and float(rows[0]["value"][1]) > 0  # type: ignore[index]

        wait_until(rule_has_traffic, 30, f"the recording rule {RULE} to show the load")
    finally:
        for process in (prom, server):
            process.terminate()
        for process in (prom, server):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def query_ok(port: int, promql: str) -> bool:
    try:
        query(port, promql)
    except OSError:
        return False
    return True
