"""Optimum's ORTModelForSeq2SeqLM.generate on a MarianMTModel directory: target tokens per second.

    <python of a venv with optimum-onnx> -m benchmarks.importing.optimum_row --model DIR \
        --texts FILE --threads 1 [--beam 5 --batch 32 --max-tokens 64]

The same ONNX Runtime under a Python loop (optimum-onnx exports the model to an encoder and a
decoder with its cache, then transformers' generate drives them). optimum-onnx 0.1.0 needs
transformers < 4.58, which this project's venv does not have, so transformer_speed runs this
module in a venv of its own (`--optimum-python`) and reads the one line of JSON it prints:
{"target_tokens", "seconds"}, counted as transformer_speed counts generate's (the start token and
the padding after the end are not tokens). It imports nothing of this repository.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--texts", type=Path, required=True, help="one text a line, in order")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from transformers import MarianTokenizer

    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    texts = args.texts.read_text(encoding="utf-8").splitlines()
    tokenizer = MarianTokenizer.from_pretrained(str(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        exported = ORTModelForSeq2SeqLM.from_pretrained(str(args.model), export=True)
        exported.save_pretrained(tmp)  # then loaded as a user loads an exported model
        model = ORTModelForSeq2SeqLM.from_pretrained(
            tmp, session_options=options, provider="CPUExecutionProvider"
        )
        eos, pad = model.config.eos_token_id, model.config.pad_token_id
        kwargs = {"num_beams": args.beam, "max_new_tokens": args.max_tokens}
        model.generate(**tokenizer(texts[: args.batch], return_tensors="pt", padding=True),
                       **kwargs)  # fmt: skip  # warm-up
        tokens = 0
        start = time.perf_counter()
        for i in range(0, len(texts), args.batch):
            batch = tokenizer(texts[i : i + args.batch], return_tensors="pt", padding=True)
            for row in model.generate(**batch, **kwargs):
                tokens += int(((row != pad) | (row == eos)).sum())
        seconds = time.perf_counter() - start
    print(json.dumps({"target_tokens": tokens, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
