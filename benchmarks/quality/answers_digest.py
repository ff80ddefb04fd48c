"""The answers a change must keep byte for byte: s2s-translate on every bundle in models/ (n-best 2,
JSON with the matrices) and the served answers of the Greek GRU and the Transformer, written to a
folder; `--compare` says which of two such folders differ.

    python -m benchmarks.quality.answers_digest --out /tmp/answers-before [--texts 40]
    python -m benchmarks.quality.answers_digest --compare /tmp/answers-before /tmp/answers-after

A restructuring that says "behaviour unchanged" runs it on the tree before and after: the CLI's
stdout and the served TranslateResponse (serialized deterministically, request id cleared) are
compared as bytes, not as texts or rounded scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc

from benchmarks.sample_texts import bundle_texts
from loadtest.harness import LocalServer
from proto.translation.v1 import translation_pb2 as pb
from proto.translation.v1 import translation_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent.parent
SERVED = ("grc-en-nt", "grc-en-nt-transformer")


def bundles() -> list[Path]:
    return sorted(p for p in (REPO / "models").iterdir() if (p / "manifest.json").is_file())


def translated_by_cli(bundle: Path, texts: list[str]) -> bytes:
    command = [sys.executable, "-m", "service.cli.translate", "--bundle", str(bundle),
               "--json", "--nbest", "2", "--beam", "4"]  # fmt: skip
    out = subprocess.run(command, input="\n".join(texts) + "\n", capture_output=True, text=True,
                         cwd=REPO, check=True)  # fmt: skip
    return out.stdout.encode()


def served_answers(bundle: Path, texts: list[str]) -> bytes:
    """One request per text and one with all of them, word alignment, n-best 2."""
    with tempfile.TemporaryDirectory() as scratch:
        server = LocalServer.start(str(bundle), "iteration", Path(scratch), ready_timeout_s=120)
        try:
            with grpc.insecure_channel(server.target) as channel:
                stub = pb_grpc.TranslatorStub(channel)
                options = pb.DecodingOptions(
                    beam_size=4, n_best=2, alignment=pb.ALIGNMENT_MODE_WORD
                )
                requests = [[t] for t in texts] + [texts]
                answers = []
                for batch in requests:
                    response = stub.Translate(pb.TranslateRequest(texts=batch, options=options),
                                              timeout=300)  # fmt: skip
                    response.request_id = ""
                    answers.append(response.SerializeToString(deterministic=True))
        finally:
            server.stop()
    return b"".join(len(a).to_bytes(4, "little") + a for a in answers)


def write(out: Path, texts_per_bundle: int) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for bundle in bundles():
        texts = bundle_texts(bundle)[:texts_per_bundle]
        answers = {"cli": translated_by_cli(bundle, texts)}
        if bundle.name in SERVED:
            answers["served"] = served_answers(bundle, texts)
        for kind, data in answers.items():
            name = f"{bundle.name}.{kind}"
            (out / name).write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
            print(f"{name:40} {len(data):9} bytes  {digests[name][:16]}", flush=True)
    (out / "digests.json").write_text(json.dumps(digests, indent=1) + "\n")
    return digests


def compare(before: Path, after: Path) -> int:
    a = json.loads((before / "digests.json").read_text())
    b = json.loads((after / "digests.json").read_text())
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for name in sorted(a.keys() | b.keys()):
        print(f"{name:40} {'same' if name not in differ else 'DIFFERENT'}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--texts", type=int, default=40, help="texts per bundle (default: 40)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("--out or --compare")
    write(args.out, args.texts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
