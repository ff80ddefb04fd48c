"""A Hugging Face MarianMTModel beside its import, sentence by sentence: the same translations,
scores, n-best lists and attention.

    python -m benchmarks.importing.transformer_exact --sentences 500 [--json PATH]

The model is made here (export/toolkits/hf_fixture.py: SentencePiece models and a 2 + 2 layer
Marian trained 800 steps to copy number words); the sentences are drawn with another seed and
none is a training line. transformers decodes each with `generate(num_beams=5,
num_return_sequences=5)` in batches of 32; the import decodes them at beam 5, n-best 5, with the
bundle's decoding defaults (generate's rules: length^1.0 normalization, max_length - 1 tokens,
the "heuristic" stopping rule), through the host search. Counted: the best translation equal, the
whole n-best list equal (texts in order), the largest difference between generate's
`sequences_scores` and ours on equal hypotheses (of texts with no hypothesis cut at the maximum
length), and the largest difference between our best hypothesis's alignment matrix and
transformers' cross-attention on the same tokens (`output_attentions=True`, the last layer,
heads averaged). The texts whose lists differ are listed, each with whether a hypothesis there
was cut at the maximum length (generate forces an end of sentence as its last token; this search
cuts).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

BATCH, BEAM = 32, 5


@dataclass
class Figures:
    sentences: int
    same_best: int
    same_nbest: int
    max_score_diff: float
    max_attention_diff: float
    seconds_theirs: float
    seconds_ours: float
    # the texts whose n-best lists differ, and whether a hypothesis there was cut at the maximum
    # length (generate forces an end of sentence as its last token; the search here cuts)
    differences: list[dict[str, Any]]


def held_out(count: int) -> list[str]:
    """`count` texts, none of them a line the fixture trained on."""
    from export.toolkits.hf_fixture import corpus

    seen = set(corpus(2000, seed=1)) | set(corpus(400, seed=0))
    texts = [t for t in dict.fromkeys(corpus(count * 3, seed=123)) if t not in seen]
    return texts[:count]


def theirs(model: Any, tokenizer: Any, texts: list[str]) -> list[list[tuple[str, float]]]:
    """generate's n-best texts with their sequences_scores, per text."""
    import torch

    out: list[list[tuple[str, float]]] = []
    for i in range(0, len(texts), BATCH):
        batch = tokenizer(texts[i : i + BATCH], return_tensors="pt", padding=True)
        with torch.no_grad():
            result = model.generate(**batch, num_beams=BEAM, num_return_sequences=BEAM,
                                    output_scores=True, return_dict_in_generate=True)  # fmt: skip
        decoded = tokenizer.batch_decode(result.sequences, skip_special_tokens=True)
        scores = result.sequences_scores.tolist()
        for j in range(len(decoded) // BEAM):
            out.append(list(zip(decoded[j * BEAM : (j + 1) * BEAM],
                                scores[j * BEAM : (j + 1) * BEAM], strict=True)))  # fmt: skip
    return out


def attention_diff(model: Any, tokenizer: Any, text: str, pieces: list[str], matrix: Any) -> float:
    """Our best hypothesis's matrix against transformers' last-layer cross-attention (heads
    averaged) on the same tokens, teacher-forced."""
    import torch

    ids = tokenizer.convert_tokens_to_ids(pieces)
    start = model.config.decoder_start_token_id
    with torch.no_grad():
        out = model(**tokenizer([text], return_tensors="pt"),
                    decoder_input_ids=torch.tensor([[start, *ids]]), output_attentions=True)  # fmt: skip
    cross = out.cross_attentions[-1][0].mean(0).numpy()[: len(pieces)]
    return float(np.abs(cross - matrix).max()) if len(pieces) else 0.0


def served_nbest(
    bundle: Path, texts: list[str], threads: int | None = None
) -> tuple[list[Any], float]:
    """The bundle's n-best BEAM lists (host search, its decoding defaults, subword alignments) in
    batches of BATCH, and the seconds they took."""
    from service.decode.engine.engine import Engine
    from service.decode.shared.config import RuntimeConfig
    from service.decode.shared.options import SearchOptions

    config = RuntimeConfig(providers=("CPUExecutionProvider",), search="host")
    if threads is not None:
        config = replace(config, intra_op_threads=threads)
    engine = Engine.load(bundle, config)
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": BEAM, "n_best": BEAM})
    start = time.perf_counter()
    got: list[Any] = []
    for i in range(0, len(texts), BATCH):
        got += engine.translate(texts[i : i + BATCH], options, "subword")
    return got, time.perf_counter() - start


def measure(model_dir: Path, bundle: Path, texts: list[str]) -> Figures:
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    tokenizer = MarianTokenizer.from_pretrained(str(model_dir))
    start = time.perf_counter()
    expected = theirs(model, tokenizer, texts)
    seconds_theirs = time.perf_counter() - start
    got, seconds_ours = served_nbest(bundle, texts)
    same_best = same_nbest = 0
    score_diff = attention = 0.0
    differences: list[dict[str, Any]] = []
    for text, nbest, translation in zip(texts, expected, got, strict=True):
        ours = [(h.text, h.score) for h in translation.hypotheses]
        same_best += ours[0][0] == nbest[0][0]
        same_nbest += [t for t, _ in ours] == [t for t, _ in nbest]
        cut = any(not h.finished for h in translation.hypotheses)
        if [t for t, _ in ours] != [t for t, _ in nbest]:
            differences.append({"source": text, "theirs": nbest, "ours": ours, "cut": cut})
        for (text_ours, score_ours), (text_theirs, score_theirs) in zip(ours, nbest, strict=False):
            if text_ours == text_theirs and not cut:
                score_diff = max(score_diff, abs(score_ours - score_theirs))
        best = translation.hypotheses[0]
        assert best.alignment is not None
        attention = max(attention, attention_diff(model, tokenizer, text, best.tokens,
                                                  best.alignment.matrix))  # fmt: skip
    return Figures(len(texts), same_best, same_nbest, score_diff, attention,
                   seconds_theirs, seconds_ours, differences)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from export.importers.huggingface import import_model
    from export.toolkits.hf_fixture import write_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / "hf", train_steps=800)
        bundle = import_model(model_dir, Path(tmp) / "bundle", "hf-tiny", "1")
        figures = measure(model_dir, bundle, held_out(args.sentences))
    summary = {k: v for k, v in asdict(figures).items() if k != "differences"}
    cut = sum(d["cut"] for d in figures.differences)
    print(
        json.dumps({**summary, "differing": len(figures.differences), "of_them_cut": cut}, indent=1)
    )
    if args.json:
        args.json.write_text(json.dumps({"format": "huggingface", **asdict(figures)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
