"""A small Hugging Face `MarianMTModel` directory, made here (no download): what the Hub's
OPUS-MT conversions hold (config.json, model.safetensors, source.spm, target.spm, vocab.json,
generation_config.json), at a size the tests and benchmarks build in seconds.

    python -m export.toolkits.hf_fixture --out /tmp/hf-marian [--d-model 64 --layers 2]

With `--train-steps`, the model is trained to copy its source (a few hundred steps): its
translations end and vary, so that beam searches compare rules, not near-ties; without, the
weights are random (enough for the step's equations and for speed).

With `--languages fra,spa` it is a multilingual model as OPUS-MT's en-ROMANCE and Tatoeba group
models are: its vocabulary holds `>>fra<<` and `>>spa<<`, and trained, the token a source begins
with decides the answer (the first language copies the words, the k-th writes each word k places
on in WORDS), so that each language's answers differ.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import sentencepiece as spm
import torch

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "twenty", "thirty", "forty", "fifty", "hundred", "thousand", "and", "minus", "point"]  # fmt: skip


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Number-like word sequences the SentencePiece models are trained on."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(lines):
        n = int(torch.randint(2, 9, (1,), generator=gen))
        idx = torch.randint(0, len(WORDS), (n,), generator=gen).tolist()
        out.append(" ".join(WORDS[i] for i in idx))
    return out


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, bos_id=-1, eos_id=1, unk_id=0, pad_id=-1,
        minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def train_copy(
    model: torch.nn.Module, ids: list[list[int]], pad: int, steps: int, seed: int
) -> None:
    """Teach the model to copy its source: Adam, batches of 32, teacher forcing."""
    train_pairs(model, [(r, r) for r in ids], pad, steps, seed)


def train_pairs(
    model: torch.nn.Module,
    pairs: list[tuple[list[int], list[int]]],
    pad: int,
    steps: int,
    seed: int,
    lr: float = 3e-3,
) -> None:
    """Teach the model each (source ids, target ids) pair: Adam, batches of 32, teacher forcing."""
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        rows = [pairs[int(i)] for i in torch.randint(0, len(pairs), (32,), generator=gen)]
        width = max(len(s) for s, _ in rows)
        src = torch.tensor([s + [pad] * (width - len(s)) for s, _ in rows])
        length = max(len(t) for _, t in rows)
        labels = torch.tensor([t + [-100] * (length - len(t)) for _, t in rows])
        loss = model(input_ids=src, attention_mask=src != pad, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def write_model(
    out: Path, d_model: int = 32, layers: int = 2, heads: int = 4, ffn: int = 64,
    activation: str = "swish", seed: int = 0, train_steps: int = 0, vocab_size: int = 40,
    extra_pieces: int = 0, languages: tuple[str, ...] = (),
) -> Path:  # fmt: skip
    """Write the directory; returns it. `extra_pieces`: vocabulary entries past the SentencePiece
    model's (pieces no text is cut into, which the model may still emit): a vocabulary of
    OPUS-MT's size for speed, where the text does not matter. `languages`: target languages, each
    a `>>name<<` piece of the vocabulary (after `</s>` and `<unk>`) whose source answers as
    `in_language` says."""
    from transformers import MarianConfig, MarianMTModel

    out.mkdir(parents=True, exist_ok=True)
    content = train_spm(corpus(seed=seed), vocab_size)
    (out / "source.spm").write_bytes(content)
    (out / "target.spm").write_bytes(content)
    processor = spm.SentencePieceProcessor(model_proto=content)
    codes = [f">>{name}<<" for name in languages]
    pieces = ["</s>", "<unk>", *codes] + [
        processor.IdToPiece(i) for i in range(processor.GetPieceSize())
        if processor.IdToPiece(i) not in ("</s>", "<unk>")
    ] + [f"▁x{i}" for i in range(extra_pieces)] + ["<pad>"]  # fmt: skip
    vocab = {piece: i for i, piece in enumerate(pieces)}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    pad = vocab["<pad>"]
    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=len(pieces), decoder_vocab_size=len(pieces), d_model=d_model,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        activation_function=activation, max_position_embeddings=256, pad_token_id=pad,
        eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True, scale_embedding=True,
    )  # fmt: skip
    model = MarianMTModel(config)
    if train_steps:
        lines = corpus(2000, seed=seed + 1)

        def encode(line: str) -> list[int]:
            return [vocab.get(p, 1) for p in processor.EncodeAsPieces(line)] + [0]

        if not languages:
            train_copy(model, [encode(line) for line in lines], pad, train_steps, seed)
        else:
            pairs = [
                ([vocab[code], *encode(line)], encode(in_language(line, k)))
                for line in lines
                for k, code in enumerate(codes)
            ]
            train_pairs(model, pairs, pad, train_steps, seed, lr=1e-2)  # learns in fewer steps
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 5
    model.generation_config.max_length = 64
    model.save_pretrained(str(out))
    return out


def in_language(line: str, k: int) -> str:
    """A line as the k-th target language of a multilingual fixture writes it: each word k places
    on in WORDS (the first language copies)."""
    return " ".join(WORDS[(WORDS.index(w) + k) % len(WORDS)] for w in line.split())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=64)
    parser.add_argument("--activation", default="swish")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--extra-pieces", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=40, help="SentencePiece pieces")
    parser.add_argument(
        "--languages", default="", help="target languages, comma-separated (e.g. fra,spa): each a "
        ">>name<< token of the vocabulary that chooses the answer (a multilingual model)"
    )  # fmt: skip
    args = parser.parse_args(argv)
    languages = tuple(name for name in args.languages.split(",") if name)
    write_model(args.out, args.d_model, args.layers, args.heads, args.ffn, args.activation,
                args.seed, args.train_steps, args.vocab_size, args.extra_pieces,
                languages)  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
