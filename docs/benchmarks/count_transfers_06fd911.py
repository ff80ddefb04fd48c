"""The "before" figure: host<->device bytes per step of the runtime at commit 06fd911 (before the ledger).

    git archive 06fd911 | tar -x -C /tmp/base && cp proto/translation/v1/*_pb2* /tmp/base/proto/translation/v1/
    PYTHONPATH=/tmp/base python docs/benchmarks/count_transfers_06fd911.py --seconds 15 --policy iteration

That commit's runtime has no ledger, so this script wraps its methods and counts, by the ledger's
definitions (service/decode/transfers.py), every copy it made between host numpy and device OrtValues:
the encoder's inputs and its outputs' download (split_sentences), the state buffer's download and
re-upload and the whole encoder tensors' re-upload on every join (add_sentences) and leave
(keep_sentences → upload_encoder_tensors), and each step's tokens, back-pointers, k, top-k and
attention. It then runs that commit's serving-loop benchmark unchanged.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import numpy as np

from benchmarks import serving_loop
from service.decode import runtime

moved: Counter[str] = Counter()


def count(reason: str, *arrays: Any) -> None:
    moved[reason] += sum(int(np.asarray(a).nbytes) for a in arrays)


def wrap_encode(original: Any) -> Any:
    def encode(self: Any, src: np.ndarray, lengths: np.ndarray) -> Any:
        count("tokens", src.astype(np.int64), lengths.astype(np.int64))
        return original(self, src, lengths)

    return encode


def wrap_split(original: Any) -> Any:
    def split(encoded: Any, lengths: np.ndarray, keys_follow_source: bool) -> Any:
        count("encoder_rows", encoded.values.numpy(), encoded.keys.numpy())
        count("state", encoded.state.numpy())
        return original(encoded, lengths, keys_follow_source)

    return split


def wrap_add(original: Any) -> Any:
    def add_sentences(self: Any, sentences: Any) -> int:
        new = np.stack([s.state for s in sentences])
        if self.state is not None:
            old = self.state.numpy()
            count("state", old)  # downloaded
            count("state", old, new)  # the concatenation uploaded
        else:
            count("state", new)
        return int(original(self, sentences))

    return add_sentences


def wrap_upload(original: Any) -> Any:
    def upload_encoder_tensors(self: Any) -> None:
        count("encoder_rows", *self.rows.views())
        original(self)

    return upload_encoder_tensors


def wrap_step(original: Any) -> Any:
    def step(self: Any, tokens: np.ndarray, reorder: np.ndarray, k: int) -> Any:
        count("tokens", tokens.astype(np.int64), reorder.astype(np.int64), np.array(k, np.int64))
        out = original(self, tokens, reorder, k)
        count("topk", out.log_probs, out.token_ids)
        count("attention", out.attention)
        return out

    return step


def main() -> int:
    runtime.OnnxModel.encode = wrap_encode(runtime.OnnxModel.encode)  # type: ignore[method-assign]
    runtime.split_sentences = wrap_split(runtime.split_sentences)
    decoder: Any = runtime.OnnxDecoder
    decoder.add_sentences = wrap_add(decoder.add_sentences)
    decoder.upload_encoder_tensors = wrap_upload(decoder.upload_encoder_tensors)
    decoder.step = wrap_step(decoder.step)
    original_run = serving_loop.run_policy

    def run_policy(*args: Any, **kwargs: Any) -> dict[str, object]:
        moved.clear()
        STEPS[0] = 0
        row = original_run(*args, **kwargs)
        steps = max(STEPS[0], 1)
        print(
            f"  {row['policy']}: {steps} steps, {sum(moved.values()) / steps:,.0f} bytes/step ("
            + ", ".join(f"{r} {n / steps:,.0f}" for r, n in moved.items())
            + ")"
        )
        return row

    serving_loop.run_policy = run_policy
    original_observe = serving_loop.Metrics.observe_step

    def observe_step(self: Any, sentences: int, hypotheses: int, seconds: float) -> None:
        STEPS[0] += 1
        original_observe(self, sentences, hypotheses, seconds)

    serving_loop.Metrics.observe_step = observe_step  # type: ignore[method-assign]
    return serving_loop.main(sys.argv[1:])


STEPS = [0]

if __name__ == "__main__":
    raise SystemExit(main())
