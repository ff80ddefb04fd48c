"""The supervisor: `s2s-serve` on more than one core starts the engine and front processes, watches
them and stands for the server (signals, /metrics, exit status).

    supervisor ─┬─ engine 0 (decode loop; one per device)  ipc://RUN/engine-0
                ├─ ...
                ├─ front 0 (gRPC + HTTP on the ports, SO_REUSEPORT)
                └─ ...

Start: the engines first (each loads and warms its models); once each has published its versions
the fronts start, and bind the ports once they follow them (service/serve/grpc_server.py). An engine
that fails before it ever served (a bad bundle, --require-provider) stops the start: every process
ends and the supervisor exits 1.

Watching: a process that exits is started again (after `RESTART_DELAY_S`, doubling up to
`MAX_RESTART_DELAY_S` while it keeps failing within `STABLE_S`). An engine that stops beating for
`SILENT_S`, or whose decode loop spends --engine-hang-s in one iteration, is killed and restarted.
Its fronts answer the requests it held UNAVAILABLE, and the requests that come meanwhile wait for
it (service/serve/engine_link.py), unless its start fails again: then the supervisor tells the
fronts why in RUN/engine-N.failed (`start_failed`: the engine's own "cannot start" line, left in
RUN/engine-N.error, else its exit status), which ends their wait, until it serves again.

Signals: SIGHUP goes to the engines (they reload and publish; the fronts follow). SIGTERM or
SIGINT drains: the fronts first (each stops taking requests, answers the accepted ones within
--grace-s), then the engines (nothing is left in them by then); exit 0 when every process did.

/metrics (--metrics-port) merges every process's series (service/serve/pod_metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, start_http_server

from service.serve import channel as ch
from service.serve.config import Settings
from service.serve.metrics import ROLES
from service.serve.pod_metrics import GATHER_S, PodCollector, Retired

log = logging.getLogger("s2s.supervisor")

RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 10.0
STABLE_S = 30.0  # a process that lived this long starts again without delay
SILENT_S = (
    10.0  # an engine not heard of for this long (stopped, or stuck holding the GIL) is killed
)
STOP_EXTRA_S = 10.0  # after --grace-s, the time a process has to exit before it is killed


def available_cores() -> int:
    """The cores this process may use: its affinity, within a cgroup v2 CPU quota if one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores or 1, max(1, int(-(-int(quota) // int(period)))))
    except (OSError, ValueError):
        pass
    return max(1, cores or 1)


def die_with_parent(parent: int) -> None:
    """A front or engine process ends when its supervisor does, even killed (SIGKILL gives it
    no chance to stop them): Linux's parent-death signal. Elsewhere, nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the supervisor died before the call (PID 1 may be the supervisor)
        os._exit(1)


def failed_file(run_dir: Path, index: int) -> Path:
    """Where the supervisor says why engine `index`'s start failed again (until it serves)."""
    return run_dir / f"engine-{index}.failed"


def start_failure(run_dir: Path, index: int) -> str:
    """Why engine `index`'s start failed again, as its fronts read it; "" while none did since
    it last served."""
    try:
        return failed_file(run_dir, index).read_text()
    except OSError:
        return ""


def layout(settings: Settings, cores: int | None = None) -> tuple[int, int]:
    """(fronts, engines): --fronts -1 follows the cores (0: the single-process mode)."""
    cores = available_cores() if cores is None else cores
    s = settings.server
    fronts = s.fronts
    if fronts < 0:
        fronts = 0 if cores < 2 else max(1, cores // 4)
    engines = s.engines or 1
    return fronts, engines


def reserve_port(host: str, port: int) -> socket.socket | None:
    """Port 0 becomes a free port, held (SO_REUSEPORT, not listening) so that the fronts share it."""
    if port != 0:
        return None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


@dataclass
class Child:
    """One process: what it is, how to start it, and its life so far."""

    role: str  # "engine" or "front"
    index: int
    argv: list[str]
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    delay: float = RESTART_DELAY_S
    served: bool = False  # an engine: has published its versions at least once
    beat: float = 0.0  # an engine: its last heartbeat (monotonic)
    busy_s: float = 0.0
    name: str = ""  # an engine: its life, from its heartbeat
    generation: int = 0  # an engine: the generation of versions it published last
    peer: ch.Peer | None = None
    exits: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.role}-{self.index}"


class Supervisor:
    def __init__(self, settings: Settings, argv: Sequence[str], fronts: int, engines: int) -> None:
        self.settings = settings
        self.argv = list(argv)
        self.run_dir = Path(tempfile.mkdtemp(prefix="s2s-"))
        (self.run_dir / "metrics").mkdir()
        self.stopping = False
        self.failed_start = False
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.restarts = Counter(  # as Metrics.process_restarts, which every process exports at 0
            "s2s_process_restarts",
            "Front and engine processes started again after they exited or hung, by role.",
            ["role"],
            registry=self.registry,
        )
        for role in ROLES:
            self.restarts.labels(role)
        self.pod = PodCollector(self.registry, self.run_dir, Retired())
        s = settings.server
        self.held = [reserve_port(s.host, s.port)]
        port = s.port or self.held[0].getsockname()[1]  # type: ignore[union-attr]
        http_port = s.http_port
        if http_port == 0:
            self.held.append(reserve_port(s.host, 0))
            http_port = self.held[-1].getsockname()[1]  # type: ignore[union-attr]
        self.port, self.http_port = port, http_port
        self.engines = [
            Child("engine", i, ["--channel", self.address(i), "--engine-index", str(i)])
            for i in range(engines)
        ]
        channels = ",".join(self.address(i) for i in range(engines))
        self.fronts = [
            Child(
                "front",
                i,
                [
                    "--channel",
                    channels,
                    "--front-index",
                    str(i),
                    "--port",
                    str(port),
                    "--http-port",
                    str(http_port),
                ],
            )
            for i in range(fronts)
        ]

    def address(self, index: int) -> str:
        return f"ipc://{self.run_dir}/engine-{index}"

    # --- processes ------------------------------------------------------------------------------

    async def spawn(self, child: Child) -> None:
        (self.run_dir / "metrics" / f"{child.label}.port").unlink(missing_ok=True)
        child.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.serve.server",
            "--role",
            child.role,
            "--run-dir",
            str(self.run_dir),
            "--parent",
            str(os.getpid()),
            *self.argv,
            *child.argv,  # after the server's flags: its own port, channel
            stdin=asyncio.subprocess.DEVNULL,
        )
        child.started = time.monotonic()
        child.name, child.served, child.beat, child.generation = "", False, time.monotonic(), 0
        log.info(
            "process started",
            extra={"role": child.role, "index": child.index, "pid": child.process.pid},
        )

    async def keep(self, child: Child) -> None:
        """Run `child` until the supervisor stops: started again whenever it exits."""
        while True:
            assert child.process is not None
            code = await child.process.wait()
            child.exits.append(code)
            self.pod.gone(child.label, self.final_reading(child))
            if self.stopping:
                return
            if child.role == "engine" and not child.served and not child.restarts:
                log.warning(
                    "engine %d exited with status %d before serving: stopping", child.index, code
                )
                self.failed_start = True
                self.stop_event.set()
                return
            if child.role == "engine" and not child.served:
                self.start_failed(child, code)
            lived = time.monotonic() - child.started
            child.delay = (
                RESTART_DELAY_S if lived > STABLE_S else min(child.delay * 2, MAX_RESTART_DELAY_S)
            )
            log.error(
                "process exited; starting it again",
                extra={"role": child.role, "index": child.index, "status": code,
                       "delay_s": child.delay},
            )  # fmt: skip
            await asyncio.sleep(child.delay)
            if self.stopping:
                return
            child.restarts += 1
            self.restarts.labels(child.role).inc()
            await self.spawn(child)

    def start_failed(self, child: Child, code: int) -> None:
        """An engine started again exited before it served: its fronts learn why (RUN/engine-N.failed,
        written whole: a front never reads half of it), which ends the wait of their requests."""
        error_file = self.run_dir / f"{child.label}.error"  # the engine's "cannot start" reason
        try:
            error = error_file.read_text().strip()
        except OSError:
            error = ""
        error_file.unlink(missing_ok=True)
        why = f"engine {child.index} failed to start again (exit status {code})"
        why += f": {error}" if error else ""
        log.error("engine failed to start again", extra={"index": child.index, "why": why})
        path = failed_file(self.run_dir, child.index)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(why)
        os.replace(temporary, path)

    def final_reading(self, child: Child) -> str | None:
        path = self.run_dir / "metrics" / f"{child.label}.final"
        try:
            text = path.read_text()
        except OSError:
            return None
        path.unlink(missing_ok=True)
        return text

    # --- the engines' heartbeats ----------------------------------------------------------------

    def watch_engine(self, child: Child) -> None:
        def beat(message: Sequence[Any]) -> None:
            _, name, busy_s, _, _ = message
            child.name = name
            child.beat, child.busy_s = time.monotonic(), busy_s

        def versions(message: Sequence[Any]) -> None:
            # a sign of life too: an engine's first VERSIONS may come before its first BEAT, and
            # its last beat is then its start (a load longer than SILENT_S read as a hang, killed
            # at once, again at every restart)
            child.served, child.generation, child.beat = True, message[1], time.monotonic()
            failed_file(self.run_dir, child.index).unlink(missing_ok=True)  # it serves again
            assert child.peer is not None
            child.peer.send((ch.ACK, message[1]))

        child.peer = ch.Peer(self.address(child.index), "supervisor", versions, beat)
        child.peer.start()

    async def watch(self) -> None:
        """Kill an engine that stopped beating or whose decode loop hangs (`keep` restarts it);
        ping the engines; read the processes' metrics now and then (for the counters of one that
        dies)."""
        hang_s = self.settings.server.engine_hang_s
        silent_s = min(SILENT_S, hang_s)
        gathered = pinged = 0.0
        while not self.stopping:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for child in self.engines:
                process = child.process
                if process is None or process.returncode is not None or not child.served:
                    continue
                silent = now - child.beat > silent_s
                if silent or child.busy_s > hang_s:
                    log.error(
                        "engine hung: killing it",
                        extra={"index": child.index, "silent_s": round(now - child.beat, 1),
                               "busy_s": round(child.busy_s, 1)},
                    )  # fmt: skip
                    child.beat, child.busy_s = now, 0.0
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            if now - pinged >= 1.0:
                pinged = now
                for child in self.engines:
                    if child.peer is not None:
                        child.peer.hello(child.name, child.generation)
            if now - gathered >= GATHER_S:
                gathered = now
                await asyncio.get_running_loop().run_in_executor(None, self.pod.gather)

    # --- the whole ------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        metrics_http, metrics_port = None, None
        s = self.settings.server
        if s.metrics_port >= 0:
            registry = CollectorRegistry()
            registry.register(self.pod)
            metrics_http, _ = start_http_server(
                s.metrics_port, addr=s.metrics_host, registry=registry
            )
            metrics_port = metrics_http.server_address[1]
        log.info(
            "starting",
            extra={"engines": len(self.engines), "fronts": len(self.fronts), "port": self.port,
                   "http_port": self.http_port, "metrics_port": metrics_port,
                   "run_dir": str(self.run_dir)},
        )  # fmt: skip
        keepers: list[asyncio.Task[None]] = []
        watcher = loop.create_task(self.watch())
        try:
            for child in self.engines:
                await self.spawn(child)
                self.watch_engine(child)
                keepers.append(loop.create_task(self.keep(child)))
            while not all(c.served for c in self.engines) and not self.stop_event.is_set():
                await asyncio.sleep(0.05)
            if not self.stop_event.is_set():
                for child in self.fronts:
                    await self.spawn(child)
                    keepers.append(loop.create_task(self.keep(child)))
            await self.stop_event.wait()
        finally:
            self.stopping = True
            await self.stop_all()
            watcher.cancel()
            await asyncio.wait(keepers, timeout=1.0) if keepers else None
            for task in keepers:
                task.cancel()
            for child in self.engines:
                if child.peer is not None:
                    await child.peer.close()
            if metrics_http is not None:
                metrics_http.shutdown()
                metrics_http.server_close()
            for sock in self.held:
                if sock is not None:
                    sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.failed_start:
            return 1
        children = [c for c in self.engines + self.fronts if c.process is not None]
        codes = [c.process.returncode for c in children]  # type: ignore[union-attr]
        log.info("stopped", extra={"exit_codes": codes})
        return 0 if all(stopped_cleanly(c) for c in children) else 1

    def reload(self) -> None:
        """SIGHUP: the engines reload and publish; the fronts follow."""
        for child in self.engines:
            if child.process is not None and child.process.returncode is None:
                child.process.send_signal(signal.SIGHUP)

    async def stop_all(self) -> None:
        """The fronts drain first (they hold the requests), then the engines."""
        log.info("shutting down", extra={"grace_s": self.settings.server.grace_s})
        await self.terminate(self.fronts, self.settings.server.grace_s + STOP_EXTRA_S)
        await self.terminate(self.engines, STOP_EXTRA_S)

    async def terminate(self, children: Sequence[Child], timeout: float) -> None:
        running = [c for c in children if c.process is not None and c.process.returncode is None]
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for child in running:
            assert child.process is not None
            try:
                await asyncio.wait_for(child.process.wait(), timeout)
            except TimeoutError:
                log.error("process did not stop: killing it", extra={"role": child.role})
                child.process.kill()
                await child.process.wait()


def stopped_cleanly(child: Child) -> bool:
    """Exit 0; or an engine that was still starting again (after a restart: it had not published
    its versions, so it held no request) ended by the stop's SIGTERM before its handler was in
    place."""
    assert child.process is not None
    code = child.process.returncode
    starting = child.role == "engine" and not child.served
    return code == 0 or (starting and code == -signal.SIGTERM)


def supervise(settings: Settings, argv: Sequence[str], fronts: int, engines: int) -> int:
    """Run the server as processes. What stops an engine's start (a bad bundle, a provider
    --require-provider asks that did not load) is its own "cannot start" line, and the exit status
    1 here; the supervisor itself never loads a provider (a CUDA context of its own would hold GPU
    memory for nothing)."""
    return asyncio.run(Supervisor(settings, argv, fronts, engines).run())
