"""The Greek→English model held to Biblica's manual alignments: one table, all on John.

- AER, precision and recall (export/metrics/aer.py: every gold link sure, over the target words
  with gold links, counts summed over verses) of forced alignment per link-extraction mode (the
  link head's "head" where the bundle has one, else the attention's), and of
  eflomal (unsupervised on the text of books 40-57, folded, grow-diag-final-and);
- BLEU and chrF (sacrebleu) of Translate, beam 5, against the BSB words without `exclude` rows (the
  model's punctuation stripped), beside the translation-memory baseline
  (benchmarks/alignment/grc_en_baselines.py);
- forced-alignment throughput in pairs/s.

    python -m benchmarks.alignment.grc_en --bundle models/grc-en-nt --checkpoint RUN/best.pt \
        --data data/grc-en [--split dev] [--limit 50] [--no-eflomal] [--json out.json]

--data holds export/data/bible.py's files (built there when missing). Forced alignment runs the
checkpoint in PyTorch (export/evaluate/alignment_eval.py's forced_attention) with the bundle's
tokenizers; without --checkpoint the alignment rows are left out.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu

from benchmarks.alignment.grc_en_baselines import TranslationMemory, eflomal_gdfa
from export.data import bible
from export.evaluate.alignment_eval import forced_attention
from export.metrics.aer import Link, format_pharaoh, parse_pharaoh, score_corpus
from export.metrics.symmetrize import grow_diag_final_and
from export.train.checkpoint import load_checkpoint
from export.train.model import Seq2Seq
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.links import LINK_MODES
from service.decode.engine.engine import Engine
from service.decode.shared.alignment import merge_subwords
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.options import SearchOptions

EXTENSIONS = ("grc", "en", "pharaoh")


@dataclass(frozen=True)
class Split:
    sources: list[str]
    targets: list[str]
    gold: list[set[Link]]

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(zip(self.sources, self.targets, strict=True))


@dataclass
class Row:
    system: str
    aer: float | None = None
    precision: float | None = None
    recall: float | None = None
    bleu: float | None = None
    chrf: float | None = None
    pairs_per_s: float | None = None


# --- data --------------------------------------------------------------------------------------


def ensure_data(directory: Path) -> None:
    """Write export/data/bible.py's splits into `directory` unless they are there."""
    if all((directory / f"{s}.{e}").is_file() for s in bible.SPLITS for e in EXTENSIONS):
        return
    if bible.main(["--out", str(directory)]) != 0:
        raise SystemExit(f"cannot build the Greek→English data in {directory}")


def read_split(directory: Path, name: str, limit: int | None = None) -> Split:
    columns = {
        ext: (directory / f"{name}.{ext}").read_text(encoding="utf-8").split("\n")[:-1]
        for ext in EXTENSIONS
    }
    sizes = {ext: len(lines) for ext, lines in columns.items()}
    if len(set(sizes.values())) != 1:
        raise SystemExit(f"{directory}/{name}.*: line counts differ: {sizes}")
    n = sizes["grc"] if limit is None else min(limit, sizes["grc"])
    return Split(
        sources=columns["grc"][:n],
        targets=columns["en"][:n],
        gold=[parse_pharaoh(line) for line in columns["pharaoh"][:n]],
    )


# --- forced alignment --------------------------------------------------------------------------


class ForcedAligner:
    """Teacher-forced attention of a PyTorch checkpoint, tokenized as the bundle tokenizes."""

    def __init__(self, model: Seq2Seq, engine: Engine) -> None:
        self.model = model
        self.engine = engine

    def word_matrices(self, pairs: Sequence[tuple[str, str]]) -> list[np.ndarray | None]:
        """One (T_words, S_words) matrix per pair, None where the pieces do not merge into the
        pair's `split(" ")` words (a tokenizer that rewrites spaces)."""
        src_tok, tgt_tok = self.engine.src_tok, self.engine.tgt_tok
        examples = [(src_tok.encode(self.engine.normalize(s)), tgt_tok.encode(t)) for s, t in pairs]
        matrices = forced_attention(self.model, examples, batch_size=32)  # (T_i, S_i) pieces
        out: list[np.ndarray | None] = []
        for (source, target), (src_ids, tgt_ids), matrix in zip(
            pairs, examples, matrices, strict=True
        ):
            src_pieces, tgt_pieces = src_tok.pieces(src_ids), tgt_tok.pieces(tgt_ids)
            if not src_pieces or not tgt_pieces:
                out.append(None)
                continue
            merged, src_words, tgt_words = merge_subwords(matrix, src_pieces, tgt_pieces)
            same = len(src_words) == len(source.split(" ")) and len(tgt_words) == len(
                target.split(" ")
            )
            out.append(merged if same else None)
        return out


def argmax_links(matrix: np.ndarray) -> set[Link]:
    """Each target word (row) to its most attended source word."""
    return {(int(s), t) for t, s in enumerate(matrix.argmax(axis=1).tolist())}


def source_argmax_links(matrix: np.ndarray) -> set[Link]:
    """Each source word (column) to the target word that attends to it most."""
    return {(s, int(t)) for s, t in enumerate(matrix.argmax(axis=0).tolist())}


def gdfa_links(matrix: np.ndarray) -> set[Link]:
    """grow-diag-final-and over the two argmax directions of one matrix."""
    return grow_diag_final_and(argmax_links(matrix), source_argmax_links(matrix))


EXTRACTORS: dict[str, Callable[[np.ndarray], set[Link]]] = {
    "argmax": argmax_links,
    "source_argmax": source_argmax_links,
    "grow-diag-final-and": gdfa_links,
}


def links_of(matrices: Sequence[np.ndarray | None], mode: str) -> list[set[Link]]:
    """The links of `mode` (one of EXTRACTORS) of every word matrix; none where it is None."""
    extract = EXTRACTORS[mode]
    return [extract(m) if m is not None else set() for m in matrices]


def align_pairs(aligner: ForcedAligner, pairs: Sequence[tuple[str, str]], mode: str) -> list[str]:
    """One Pharaoh line per (source, target) pair: word links of `mode` from the teacher-forced
    attention; an empty line where the words could not be matched."""
    return [format_pharaoh(links) for links in links_of(aligner.word_matrices(pairs), mode)]


def align_served(engine: Engine, pairs: Sequence[tuple[str, str]], mode: str) -> list[str]:
    """`Align` through the serving engine: one Pharaoh line per pair, links of `mode`."""
    options = AlignOptions(links=mode, matrices="none")
    out: list[str] = []
    for start in range(0, len(pairs), 64):
        out += [a.pharaoh for a in align(engine, pairs[start : start + 64], options)]
    return out


def served_rows(engine: Engine, test: Split) -> list[Row]:
    rows = []
    for mode in LINK_MODES:
        if mode == "head" and engine.link_head is None:
            continue  # a bundle without a link head (service/decode/runtime/link_head.py)
        started = time.perf_counter()
        lines = align_served(engine, test.pairs, mode)
        seconds = time.perf_counter() - started
        counts = score_corpus([parse_pharaoh(line) for line in lines], test.gold)
        rows.append(
            Row(
                f"Align, {mode}",
                aer=counts.aer,
                precision=counts.precision,
                recall=counts.recall,
                pairs_per_s=len(test) / seconds,
            )
        )
    return rows


def alignment_rows(aligner: ForcedAligner, test: Split) -> list[Row]:
    """One forced pass over the test pairs (timed), scored in every extraction mode."""
    started = time.perf_counter()
    matrices = aligner.word_matrices(test.pairs)
    pairs_per_s = len(test) / (time.perf_counter() - started)
    rows = []
    for mode in EXTRACTORS:
        counts = score_corpus(links_of(matrices, mode), test.gold)
        rows.append(
            Row(
                f"forced attention (PyTorch), {mode}",
                aer=counts.aer,
                precision=counts.precision,
                recall=counts.recall,
                pairs_per_s=pairs_per_s,
            )
        )
    return rows


# --- baselines and translation -----------------------------------------------------------------


def eflomal_row(directory: Path, test: Split) -> Row:
    """eflomal on train + dev + test text (test last), scored on the test pairs."""
    train, dev = read_split(directory, "train"), read_split(directory, "dev")
    sources = train.sources + dev.sources + test.sources
    targets = train.targets + dev.targets + test.targets
    links = eflomal_gdfa(sources, targets)[-len(test) :]
    counts = score_corpus(links, test.gold)
    return Row(
        "eflomal 2.0.0, grow-diag-final-and",
        aer=counts.aer,
        precision=counts.precision,
        recall=counts.recall,
    )


def translation_scores(system: str, hypotheses: Sequence[str], references: Sequence[str]) -> Row:
    return Row(
        system,
        bleu=sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score,
        chrf=sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score,
    )


def memory_row(directory: Path, test: Split) -> Row:
    """The English of the nearest Greek verse of the training books (train + dev: 40-57 but John)."""
    train, dev = read_split(directory, "train"), read_split(directory, "dev")
    memory = TranslationMemory(train.sources + dev.sources, train.targets + dev.targets)
    return translation_scores(
        "translation memory (tf-idf)", memory.translate(test.sources), test.targets
    )


def translate(engine: Engine, sources: Sequence[str], beam: int, batch_size: int) -> list[str]:
    """Best hypothesis per source, batched by length (like benchmarks/quality/int8.py)."""
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": beam})  # as served
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = engine.translate([sources[i] for i in idx], options, "none")
        for i, t in zip(idx, batch, strict=True):
            out[i] = t.hypotheses[0].text
    return out


def translate_row(engine: Engine, test: Split, beam: int) -> Row:
    hypotheses = [bible.strip_punctuation(h) for h in translate(engine, test.sources, beam, 32)]
    return translation_scores(f"Translate, beam {beam}", hypotheses, test.targets)


# --- the table ---------------------------------------------------------------------------------


def format_table(rows: Sequence[Row], title: str) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    lines = [
        title,
        "",
        "| system | AER | precision | recall | BLEU | chrF | pairs/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.system} | {cell(r.aer, 3)} | {cell(r.precision, 3)} | {cell(r.recall, 3)} "
            f"| {cell(r.bleu, 1)} | {cell(r.chrf, 1)} | {cell(r.pairs_per_s, 1)} |"
        )
    return "\n".join(lines)


def load_engine(args: argparse.Namespace) -> Engine:
    """The bundle as served on CPU, with room for the longest verses, warmed up (so that a timed
    pass pays no first-run costs)."""
    engine = Engine.load(
        args.bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=args.threads),
        EngineLimits(max_source_tokens=1024, max_length=1024),
    )
    engine.warm_up()
    return engine


def run(args: argparse.Namespace) -> tuple[list[Row], str]:
    ensure_data(args.data)
    test = read_split(args.data, args.split, args.limit)
    rows: list[Row] = served_rows(load_engine(args), test)
    if args.checkpoint is not None:
        model, _ = load_checkpoint(args.checkpoint)
        rows += alignment_rows(ForcedAligner(model, load_engine(args)), test)
    if not args.no_eflomal:
        rows.append(eflomal_row(args.data, test))
    if not args.no_translate:
        rows.append(translate_row(load_engine(args), test, args.beam))
    if args.split == "test":  # the memory holds the dev verses
        rows.append(memory_row(args.data, test))
    name = "John" if args.split == "test" else "dev"
    title = (
        f"{name}: {len(test)} verses, {sum(len(g) for g in test.gold)} gold links ({args.bundle})"
    )
    return rows, title


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bundle", type=Path, default=Path("models/grc-en-nt"))
    p.add_argument("--checkpoint", type=Path, help="the bundle's PyTorch checkpoint (alignment)")
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--limit", type=int, help="only the first N verses of John")
    p.add_argument(
        "--split", choices=("test", "dev"), default="test", help="John (test) or the dev split"
    )
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-eflomal", action="store_true", help="leave eflomal out (about a minute)")
    p.add_argument("--no-translate", action="store_true", help="leave Translate out")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows, title = run(args)
    print(format_table(rows, title))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {"title": title, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
