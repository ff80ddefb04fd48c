"""The transfer ledger: bytes copied between host memory and the model's device, by direction and reason.

On a GPU the decode loop's cost outside the kernels is what crosses the PCIe bus, and that is easy to
let grow with the batch by accident (re-uploading every sentence's encoder rows after each join).
Every host↔device copy the runtime makes goes through `service.decode.runtime.device.Device`, which records it
here, so the traffic is a number that tests bound and benchmarks print, on the CPU as on a GPU.

Under the CPU provider the "device" is host memory and most of these copies are free (an OrtValue
wraps the numpy buffer); the ledger still counts them, because they are the copies a GPU would make.
Thread-safe: the encode-ahead thread downloads encoder outputs while the decode loop steps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

# Bounded label sets (Prometheus labels of s2s_device_transfer_bytes_total).
DIRECTIONS: tuple[str, ...] = ("host_to_device", "device_to_host")
REASONS: tuple[str, ...] = (
    "state",  # decoder states: the initial state of a joining sentence
    "encoder_rows",  # encoder values/keys/mask of sentences (encoder outputs, joining rows)
    "tokens",  # token ids, back-pointers, source ids, k
    "indices",  # row indices and pads for the in-place row updates on the device
    "topk",  # the step's top-k log-probs and token ids
    "attention",  # the step's attention row per hypothesis
    "search",  # the device search's settings per sentence, and its joining sentences' fields
    "done",  # the device search's per-step flags: which sentences are done
    "hypotheses",  # a finished sentence's n-best entries and history (tokens, attention rows)
)

Key = tuple[str, str]  # (direction, reason)


@dataclass(frozen=True)
class TransferTotals:
    """A snapshot of the ledger: bytes and copies per (direction, reason)."""

    bytes: dict[Key, int]
    copies: dict[Key, int]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def minus(self, earlier: TransferTotals) -> TransferTotals:
        """What was moved between `earlier` and this snapshot."""
        return TransferTotals(
            bytes={key: n - earlier.bytes.get(key, 0) for key, n in self.bytes.items()},
            copies={key: n - earlier.copies.get(key, 0) for key, n in self.copies.items()},
        )

    def by_reason(self) -> dict[str, int]:
        """Bytes per reason, both directions together."""
        out = dict.fromkeys(REASONS, 0)
        for (_, reason), n in self.bytes.items():
            out[reason] += n
        return out


class TransferLedger:
    """Running totals of host↔device copies; `record` is the only way in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[Key, int] = {(d, r): 0 for d in DIRECTIONS for r in REASONS}
        self._copies: dict[Key, int] = dict.fromkeys(self._bytes, 0)

    def record(self, direction: str, reason: str, nbytes: int) -> None:
        key = (direction, reason)
        if key not in self._bytes:
            raise ValueError(
                f"transfer must be one of {DIRECTIONS} x {REASONS}, got {direction!r}, {reason!r}"
            )
        with self._lock:
            self._bytes[key] += int(nbytes)
            self._copies[key] += 1

    def snapshot(self) -> TransferTotals:
        with self._lock:
            return TransferTotals(bytes=dict(self._bytes), copies=dict(self._copies))
