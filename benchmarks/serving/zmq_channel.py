"""The front/engine channel's choice, measured: encoders for its messages, and its ZeroMQ round trip.

    python -m benchmarks.serving.zmq_channel [--json PATH]

Encoders: msgspec's msgpack (what service/serve/channel.py uses: arrays as an extension of raw
bytes), msgpack's own package with the same extension, and pickle protocol 5 for reference (not a
candidate: a channel must not unpickle). Messages: a Translate job of one text and of 64 (token
ids, controls, options), and their results (n-best 2, 16 target tokens, the attention of each
hypothesis as one float32 array). Each is encoded and decoded `--n` times.

Round trip: a DEALER in this process, a ROUTER echoing in another (as front and engine), over
ipc://, the one-text job out and its results back, one at a time, and 16 in flight.

The clients' channels to the server (gRPC over HTTP/2) are benchmarks/serving/grpc_channels.py's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import numpy as np
import zmq

from service.decode.shared.controls import Controls
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import Prepared
from service.serve import channel as ch


def messages() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    options = SearchOptions(beam_size=5, n_best=2)

    def job(n: int) -> tuple[Any, ...]:
        sentences = [Prepared("", rng.integers(4, 8000, 20).tolist(), []) for _ in range(n)]
        work = ch.translate_work(sentences, options, "word", [(Controls(),)] * n)
        return (ch.JOB, 1, ch.TRANSLATE, "grc-en-nt", "1.0.0", 123.4, {}, "request-id", work)

    def results(n: int) -> tuple[Any, ...]:
        T, S = 16, 20
        hyp = Hypothesis(
            rng.integers(4, 8000, T).tolist(), -1.0, -1.6,
            rng.random((T, S), np.float32), True, rng.random(T, np.float32),
        )  # fmt: skip
        return (ch.DONE, 1, ch.results_out(ch.TRANSLATE, [[[hyp, hyp]]] * n))

    return {"job_1": job(1), "results_1": results(1), "job_64": job(64), "results_64": results(64)}


def msgpack_codec() -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """msgpack's own package, with the same array extension."""

    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            header = msgpack.packb((obj.dtype.str, obj.shape))
            return msgpack.ExtType(
                ch.ARRAY, len(header).to_bytes(2, "little") + header + obj.tobytes()
            )
        raise TypeError(type(obj))

    def ext(code: int, data: bytes) -> Any:
        n = int.from_bytes(data[:2], "little")
        dtype, shape = msgpack.unpackb(data[2 : 2 + n])
        return np.frombuffer(data, np.dtype(dtype), offset=2 + n).reshape(shape)

    return (
        lambda m: msgpack.packb(m, default=default, use_bin_type=True),
        lambda d: msgpack.unpackb(d, ext_hook=ext, use_list=False, raw=False),
    )


def codecs() -> dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]]:
    out = {
        "msgspec (the channel's)": (ch.pack, ch.unpack),
        "msgpack": msgpack_codec(),
        "pickle (reference)": (lambda m: pickle.dumps(m, 5), pickle.loads),
    }
    return out


def encoders(n: int) -> list[dict[str, Any]]:
    rows = []
    for name, message in messages().items():
        for codec, (encode, decode) in codecs().items():
            data = encode(message)
            enc = timeit.timeit(lambda: encode(message), number=n) / n  # noqa: B023
            dec = timeit.timeit(lambda: decode(data), number=n) / n  # noqa: B023
            rows.append({"message": name, "codec": codec, "bytes": len(data),
                         "encode_us": round(enc * 1e6, 2), "decode_us": round(dec * 1e6, 2)})  # fmt: skip
    return rows


def echo(address: str, ready: Any) -> None:
    """The engine's end: a ROUTER that answers each job with the results message."""
    results = ch.pack(messages()["results_1"])
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    socket.bind(address)
    ready.set()
    while True:
        peer, data = socket.recv_multipart()
        if data == b"stop":
            return
        ch.unpack(data)
        socket.send_multipart((peer, results))


def round_trips(seconds: float) -> list[dict[str, Any]]:
    address = f"ipc://{tempfile.mkdtemp()}/echo"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    engine = ctx.Process(target=echo, args=(address, ready))
    engine.start()
    ready.wait(30)
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(address)
    job = messages()["job_1"]
    rows = []
    for in_flight in (1, 16):
        for _ in range(in_flight):
            socket.send(ch.pack(job))
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            ch.results_in(ch.TRANSLATE, ch.unpack(socket.recv())[2])
            socket.send(ch.pack(job))
            done += 1
        for _ in range(in_flight):
            socket.recv()
        elapsed = time.perf_counter() - start
        rows.append({"in_flight": in_flight, "round_trips_per_s": round(done / elapsed),
                     "us_per_round_trip": round(elapsed / done * 1e6, 1)})  # fmt: skip
    socket.send(b"stop")
    engine.join(10)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "versions": {"pyzmq": zmq.__version__, "msgpack": ".".join(map(str, msgpack.version)),
                     "msgspec": msgspec.__version__},
        "encoders": encoders(args.n),
        "round_trips_ipc": round_trips(args.seconds),
    }  # fmt: skip
    for row in report["encoders"]:
        print(f"{row['message']:11s} {row['codec']:19s} {row['bytes']:8d} B  "
              f"encode {row['encode_us']:8.2f} us  decode {row['decode_us']:8.2f} us")  # fmt: skip
    for row in report["round_trips_ipc"]:
        print(f"ipc round trip, {row['in_flight']:2d} in flight: {row['us_per_round_trip']} us "
              f"({row['round_trips_per_s']}/s)")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
