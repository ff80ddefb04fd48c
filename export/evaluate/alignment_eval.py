"""Do the attention matrices point at the right source words? Forced decoding against gold links.

The reference target is forced through the decoder (teacher forcing), so every test sentence is
scored on the same target words whatever the model would have emitted; the attention row used to
predict each target piece is kept, merged to words with service/decode/shared/alignment.py's subword→word rule
(the one the server applies), and each target word's argmax source word is compared with the gold
sidecar (export/data/gold.py):

- phrase accuracy: the argmax falls inside the source span of the target word's gold phrase;
- word accuracy (= precision of the argmax links): the argmax is one of the target word's gold
  source words, over the target words that have gold links;
- recall: gold links hit by an argmax link, over all gold links;
- AER (Och & Ney 2003) with sure = possible = gold links and the alignment A = the argmax links of
  the target words that have gold: 1 - 2|A∩G| / (|A| + |G|);
- off by +1 / -1: argmax links one source word after / before a gold source word (and not on
  one), over the scored target words;
- on the previous target word: the argmax (wrong) is a gold source word of the target word before
  it, i.e. the attention still looks where the last output came from. A decoder that queries
  attention before reading the last output token (the Bahdanau style) tends to lag so. In a
  monotone task this lag is an offset of -1, in the reversal task +1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from export.data.gold import GoldLinks
from export.metrics.scoring import EvaluationError
from export.train.data import make_batch
from export.train.model import Seq2Seq
from service.decode.shared.alignment import merge_subwords
from service.model.tokenizer import Tokenizer

# --- forced decoding ---------------------------------------------------------------------------


@torch.no_grad()
def forced_attention(
    model: Seq2Seq,
    examples: Sequence[tuple[list[int], list[int]]],
    batch_size: int = 100,
    device: torch.device | None = None,
) -> list[np.ndarray]:
    """(source ids, target ids) pairs → one attention matrix (T_i, S_i) per pair, in input order.

    Row t is the attention used to predict target piece t with the reference pieces before it fed
    in; the row that predicts EOS is left out, so rows match the target pieces one to one.
    """
    if model.cfg.attention == "none":
        raise EvaluationError("a model with attention 'none' has no alignment to evaluate")
    model.eval()
    device = device or next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    out: list[np.ndarray] = [np.zeros((0, 0), dtype=np.float32)] * len(examples)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = make_batch([examples[i] for i in idx]).to(device)
        _, weights = model.teacher_forced(batch.src, batch.lengths, batch.tgt_in)  # (B, T+1, S)
        weights_np = weights.float().cpu().numpy()
        for row, i in enumerate(idx):
            src_ids, tgt_ids = examples[i]
            out[i] = weights_np[row, : len(tgt_ids), : max(len(src_ids), 1)]  # (T_i, S_i)
    return out


# --- scoring -----------------------------------------------------------------------------------


@dataclass
class LinkCounts:
    """Counts that add up over sentences; `metrics()` turns them into rates."""

    sentences: int = 0
    phrase_words: int = 0  # target words inside a gold phrase
    phrase_hits: int = 0  # ... whose argmax lies in that phrase's source span
    scored_words: int = 0  # target words with gold word links (= |A|)
    word_hits: int = 0  # ... whose argmax is a gold link (= |A ∩ G|)
    gold_links: int = 0  # |G|
    plus_one: int = 0  # wrong argmax one source word after a gold source word
    minus_one: int = 0  # wrong argmax one source word before a gold source word
    previous_target: int = 0  # wrong argmax on a gold source word of the previous target word

    def add(self, other: LinkCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def metrics(self) -> dict[str, Any]:
        """Rates in percent (None where nothing was scored), with the counts behind them."""

        def pct(num: int, den: int) -> float | None:
            return round(100.0 * num / den, 2) if den else None

        aer_den = self.scored_words + self.gold_links
        return {
            "phrase_accuracy": pct(self.phrase_hits, self.phrase_words),
            "word_accuracy": pct(self.word_hits, self.scored_words),
            "word_recall": pct(self.word_hits, self.gold_links),
            "aer": pct(aer_den - 2 * self.word_hits, aer_den),
            "off_by_plus_one": pct(self.plus_one, self.scored_words),
            "off_by_minus_one": pct(self.minus_one, self.scored_words),
            "on_previous_target": pct(self.previous_target, self.scored_words),
            "counts": {f.name: getattr(self, f.name) for f in fields(self)},
        }


def word_family(gold: GoldLinks, t: int) -> str:
    """The value family of target word t: its phrase's family, or "connector" outside phrases."""
    for k, (_, _, t_start, t_end) in enumerate(gold.phrases):
        if t_start <= t < t_end:
            return gold.families[k] if gold.families else gold.family
    return "connector"


def score_words(argmax: Sequence[int], gold: GoldLinks) -> list[tuple[str, LinkCounts]]:
    """One sentence, one (family, counts) per target word: argmax[t] is target word t's argmax
    source word. The counts of a sentence's words add up to its own (sentences aside)."""
    by_target: dict[int, set[int]] = {}
    for s, t in gold.words:
        by_target.setdefault(t, set()).add(s)
    phrase_of = {t: (a, b) for a, b, t0, t1 in gold.phrases for t in range(t0, t1)}
    out: list[tuple[str, LinkCounts]] = []
    for t, a in enumerate(argmax):
        c = LinkCounts()
        if t in phrase_of:
            s_start, s_end = phrase_of[t]
            c.phrase_words, c.phrase_hits = 1, int(s_start <= a < s_end)
        sources = by_target.get(t)
        if sources:
            c.scored_words, c.gold_links = 1, len(sources)
            hit = a in sources
            c.word_hits = int(hit)
            c.plus_one = int(not hit and a - 1 in sources)
            c.minus_one = int(not hit and a + 1 in sources)
            c.previous_target = int(not hit and a in by_target.get(t - 1, ()))
        out.append((word_family(gold, t), c))
    return out


def score_links(argmax: Sequence[int], gold: GoldLinks) -> LinkCounts:
    """One sentence's counts: argmax[t] is target word t's argmax source word."""
    total = LinkCounts(sentences=1)
    for _, counts in score_words(argmax, gold):
        total.add(counts)
    return total


def check_gold(gold: GoldLinks, n_src: int, n_tgt: int, line: int) -> None:
    """Every gold index inside the sentence's words, or an error naming the sidecar line."""
    bad: list[tuple[int, ...]] = [
        p for p in gold.phrases if not (0 <= p[0] <= p[1] <= n_src and 0 <= p[2] <= p[3] <= n_tgt)
    ]
    bad += [w for w in gold.words if not (0 <= w[0] < n_src and 0 <= w[1] < n_tgt)]
    if bad:
        raise EvaluationError(
            f"gold line {line}: {bad[0]} lies outside the sentence's {n_src} source and "
            f"{n_tgt} target words: is the gold file the sidecar of this test split?"
        )


def word_argmax(
    matrix: np.ndarray, src_pieces: list[str], tgt_pieces: list[str], source: str, target: str
) -> list[int] | None:
    """Piece-level attention (T, S) → each target word's argmax source word, words being
    `text.split(" ")` (the gold's indexing); None when the pieces do not merge into those words."""
    if not src_pieces or not tgt_pieces:
        return None
    merged, src_words, tgt_words = merge_subwords(matrix, src_pieces, tgt_pieces)  # (T', S')
    if len(src_words) != len(source.split(" ")) or len(tgt_words) != len(target.split(" ")):
        return None
    return [int(a) for a in merged.argmax(axis=1)]


def evaluate_alignments(
    model: Seq2Seq,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    gold: Sequence[GoldLinks],
    batch_size: int = 100,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Forced decoding of every pair, word-level argmax links scored against gold: overall and by
    value family (each target word counts for its phrase's family, or "connector"; a family's
    `sentences` are those with a word of it). A sentence whose pieces do not merge into its `text.split(" ")` words (a tokenizer
    that rewrites spaces) is skipped and counted in `skipped`."""
    if len(gold) != len(pairs):
        raise EvaluationError(
            f"the gold file has {len(gold)} lines but the test split {len(pairs)} pairs"
        )
    examples = [(src_tok.encode(s), tgt_tok.encode(t)) for s, t in pairs]
    matrices = forced_attention(model, examples, batch_size, device)
    overall, by_family, skipped = LinkCounts(), dict[str, LinkCounts](), 0
    for line, ((src, tgt), (src_ids, tgt_ids), matrix, links) in enumerate(
        zip(pairs, examples, matrices, gold, strict=True), start=1
    ):
        check_gold(links, len(src.split(" ")), len(tgt.split(" ")), line)
        argmax = word_argmax(matrix, src_tok.pieces(src_ids), tgt_tok.pieces(tgt_ids), src, tgt)
        if argmax is None:
            skipped += 1
            continue
        words = score_words(argmax, links)
        overall.sentences += 1
        for family in {f for f, _ in words}:
            by_family.setdefault(family, LinkCounts()).sentences += 1
        for family, counts in words:
            overall.add(counts)
            by_family[family].add(counts)
    return {
        **overall.metrics(),
        "skipped": skipped,
        "by_family": {name: c.metrics() for name, c in sorted(by_family.items())},
    }
