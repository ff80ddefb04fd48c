"""An engine that answers at once, behind the real channel: what a front costs, alone.

    python -m benchmarks.serving.instant_engine ipc:///tmp/engine BUNDLE [--tokens 16]

It speaks service/serve/channel.py as an engine process does (VERSIONS, BEAT, DONE) through the
same `Endpoint`, and answers every Translate job at once with one hypothesis per sentence of
`--tokens` target tokens (ids drawn from the target vocabulary, an attention row per token over the
sentence's source ids: the shapes a real search returns) and as many as the job's n_best asks.
A front attached to it (`--channel`) does all its own work, and nothing waits for a decoder.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from service.decode.shared.search_types import Hypothesis
from service.model.bundle import load_bundle
from service.serve import channel as ch


class InstantEngine:
    def __init__(self, address: str, bundle: str, tokens: int = 16) -> None:
        loaded = load_bundle(bundle)
        self.entry = (loaded.name, loaded.version, str(loaded.path), ("CPUExecutionProvider",), 0)
        cfg = loaded.architecture
        first = max(cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.unk_id) + 1
        rng = np.random.default_rng(0)
        self.ids = rng.integers(first, cfg.tgt_vocab_size, tokens).tolist()
        self.name = f"instant-{os.getpid()}"
        self.endpoint = ch.Endpoint(address, self.handle, self.tick, 0.2)
        self.answered = 0

    def handle(self, peer: bytes, message: Sequence[Any]) -> None:
        kind = message[0]
        if kind == ch.HELLO:
            self.endpoint.send(peer, (ch.VERSIONS, 1, self.name, (self.entry,)))
        elif kind == ch.JOB:
            _, ident, job_kind, _, _, _, _, _, work = message
            sentences, options, *_ = ch.read_translate(work)
            results = [self.parts(s.parts, options.n_best) for s in sentences]
            self.endpoint.send(peer, (ch.DONE, ident, ch.results_out(job_kind, results)))
            self.answered += 1

    def parts(self, parts: Sequence[Any], n_best: int) -> list[list[Hypothesis]]:
        out = []
        for part in parts:
            T, S = len(self.ids), len(part.ids)
            attention = np.full((T, S), 1.0 / S, np.float32)  # (T, S)
            log_probs = np.full(T, -0.1, np.float32)  # (T,)
            hyp = Hypothesis(self.ids, -1.0, -1.6, attention, True, log_probs)
            out.append([hyp] * n_best)
        return out

    def tick(self) -> None:
        self.endpoint.broadcast((ch.BEAT, self.name, 0.0, 0, 0))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address")
    parser.add_argument("bundle")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)
    engine = InstantEngine(args.address, args.bundle, args.tokens)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine.endpoint.start()
    while not stop.wait(0.5):
        pass
    engine.endpoint.stop()
    time.sleep(0.1)


if __name__ == "__main__":
    main()
