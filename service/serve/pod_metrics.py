"""One /metrics for a server of several processes: every process's series, merged.

Each front and engine process keeps its own registry, exactly as the single-process server does
(service/serve/metrics.py), and serves it on 127.0.0.1 (a port the supervisor reads from the run
folder). The supervisor's endpoint gathers them at scrape time and merges samples of the same name
and labels: summed (counters, histograms, the gauges of queues, in-flight requests and memory,
the processes' CPU and memory), the largest for info gauges, the earliest for start times. So the
dashboards and rules read the same series as from one process: `s2s_queue_depth_sentences` is the
pod's queue over its engines, `process_cpu_seconds_total` its processes' CPU.

prometheus-client's own multiprocess mode was not used: it cannot remove a series (the server
removes a model version's series when the version unloads), and it drops custom collectors (the
transfer ledgers, the process metrics). A process that exits takes its counters with it; the
supervisor adds its last readings (`Retired`) so that no counter goes down, losing at most what it
counted since the last gather (`GATHER_S`).
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger("s2s.supervisor")

GATHER_S = 5.0  # the supervisor reads its processes this often, between scrapes, for `Retired`
MAX = {"s2s_model_info", "process_max_fds"}
MIN_SUFFIX = ("_created", "process_start_time_seconds")
COUNTING = ("counter", "histogram", "summary")  # families whose samples only grow

Key = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


def combine(family: str, sample: str, old: float | None, new: float) -> float:
    if old is None:
        return new
    if family in MAX:
        return max(old, new)
    if sample.endswith(MIN_SUFFIX):
        return min(old, new)
    return old + new


class Merged:
    """Families by name: (type, help, {sample key: value})."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, dict[Key, float]]] = {}

    def add_text(self, text: str) -> None:
        for family in text_string_to_metric_families(text):
            self.add(family.name, family.type, family.documentation, family.samples)

    def add(self, name: str, kind: str, help_: str, samples: Iterable[object]) -> None:
        _, _, values = self.families.setdefault(name, (kind, help_, {}))
        for s in samples:
            key = (s.name, tuple(sorted(s.labels.items())))  # type: ignore[attr-defined]
            values[key] = combine(name, key[0], values.get(key), s.value)  # type: ignore[attr-defined]

    def counting(self) -> Merged:
        """Only the samples that only grow (what a process gone leaves to keep)."""
        out = Merged()
        for name, (kind, help_, values) in self.families.items():
            if kind in COUNTING:
                out.families[name] = (kind, help_, {k: v for k, v in values.items()
                                                    if not k[0].endswith("_created")})  # fmt: skip
        return out

    def metrics(self) -> Iterable[Metric]:
        for name, (kind, help_, values) in self.families.items():
            metric = Metric(name, help_, kind)
            for (sample, labels), value in values.items():
                metric.add_sample(sample, dict(labels), value)
            yield metric


class Retired:
    """The counters of processes that exited, by sample: added to every scrape."""

    def __init__(self) -> None:
        self.merged = Merged()

    def keep(self, last: str) -> None:
        """A process's last reading, before it exited (or its final one, written at exit)."""
        reading = Merged()
        reading.add_text(last)
        for name, (kind, help_, values) in reading.counting().families.items():
            self.merged.add(name, kind, help_, _Samples(values))


class _Samples(list):  # type: ignore[type-arg]
    """(sample key -> value) as parser-like samples, for Merged.add."""

    def __init__(self, values: dict[Key, float]) -> None:
        super().__init__(_Sample(name, dict(labels), v) for (name, labels), v in values.items())


class _Sample:
    def __init__(self, name: str, labels: dict[str, str], value: float) -> None:
        self.name, self.labels, self.value = name, labels, value


def read_process(port: int, timeout: float = 2.0) -> str:
    """One process's exposition, from its endpoint on 127.0.0.1."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as reply:
        return str(reply.read().decode())


def ports(run_dir: Path) -> dict[str, int]:
    """The processes' metric ports, by process name (the files they wrote at start)."""
    out = {}
    for path in sorted((run_dir / "metrics").glob("*.port")):
        try:
            out[path.stem] = int(path.read_text())
        except (OSError, ValueError):
            continue
    return out


class PodCollector(Collector):
    """What the supervisor's /metrics serves: its own registry, every live process's, and the
    counters of the processes gone."""

    def __init__(self, own: CollectorRegistry, run_dir: Path, retired: Retired) -> None:
        self.own = own
        self.run_dir = run_dir
        self.retired = retired
        self.last: dict[str, str] = {}  # process name -> its last reading

    def gather(self) -> list[str]:
        texts = []
        for name, port in ports(self.run_dir).items():
            try:
                text = read_process(port)
            except OSError:
                continue  # starting, or gone (its last reading is kept by the supervisor)
            self.last[name] = text
            texts.append(text)
        return texts

    def collect(self) -> Iterable[Metric]:
        merged = Merged()
        merged.add_text(generate_latest(self.own).decode())
        for text in self.gather():
            merged.add_text(text)
        for name, (kind, help_, values) in self.retired.merged.families.items():
            merged.add(name, kind, help_, _Samples(values))
        yield from merged.metrics()

    def gone(self, name: str, final: str | None) -> None:
        """Process `name` exited: its final reading (or its last one) kept in the counters."""
        last = final or self.last.pop(name, None)
        self.last.pop(name, None)
        if last:
            self.retired.keep(last)


def merge_texts(texts: Sequence[str]) -> str:
    """The expositions `texts` merged into one (what a scrape of the pod reads)."""
    merged = Merged()
    for text in texts:
        merged.add_text(text)
    registry = CollectorRegistry()
    registry.register(_Fixed(list(merged.metrics())))
    return generate_latest(registry).decode()


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics
