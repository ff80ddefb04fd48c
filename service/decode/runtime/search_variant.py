"""Which search graph a running batch needs (`SearchVariant`: its beam, and whether it carries
coverage, controls, attention, a wide n-best), and the per-sentence parameters that graph reads
(`sentence_params`, in the order of `PARAMS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from service.decode.shared.options import SearchOptions
from service.decode.shared.rules import (
    exact_rule_applies,
    length_normalizer,
    patience_ends,
)

CODE = 32  # a history code is token * CODE + slot: beams of up to CODE slots
MAX_BEAM = CODE
SENTENCE_FIELDS = 3  # a sentence's steps, ended, top ended; then its n-best's and slots' fields
# a sentence's settings (rows of `settings`), written by the host when it joins
PARAMS = (
    "beam",  # the sentence's beam size (<= K): its width
    "keep",  # hypotheses it returns (n_best, <= beam)
    "alpha",  # GNMT's length penalty
    "beta",  # GNMT's coverage penalty
    "normalize",  # Marian's length normalization
    "word_penalty",  # Marian's word penalty
    "narrowing",  # 1: the beam narrows by the hypotheses ended
    "max_lp",  # lp(max_len) * max_len ** normalize: the exact rule's bound
    "pool",  # the sentence's row of the history buffers
    "max_len",  # its maximum length in steps
    # the stopping rules, each a threshold that one of the sentence's values reaches (STOP)
    "exact_at",  # the worst kept score minus the bound: 0 (the exact rule), or +inf (not)
    "stop_ends",  # ended: patience and narrowing (>= keep), else +inf
    "stop_first",  # top_ended · BIG + ended: first (BIG + keep), else +inf
    "stop_len",  # steps: its maximum length
)
STOP = 4  # the last rows of PARAMS: the stopping rules' thresholds
BIG = 1e9  # stop_first's weight of top_ended (more than any count of ended hypotheses), and a
# floor for a finished score (a normalized score is far above -BIG)


def sentence_params(options: SearchOptions, max_len: int) -> list[float]:
    """A sentence's settings (PARAMS, the pool row left at 0): service/decode/shared/rules.py's rules as
    the graph reads them: its beam and penalties, its exact bound's normalizer, and its stopping
    rule as thresholds (`_stopping`)."""
    values = {
        "beam": options.beam_size,
        "keep": options.n_best,
        "alpha": options.length_penalty,
        "beta": options.coverage_penalty,
        "normalize": options.normalize,
        "word_penalty": options.word_penalty,
        "narrowing": float(options.stopping == "narrowing"),
        "max_lp": length_normalizer(max_len, options),
        "pool": 0,
        "max_len": max_len,
        "exact_at": 0.0 if exact_rule_applies(options) else math.inf,
        "stop_ends": patience_ends(options),
        "stop_first": BIG + options.n_best if options.stopping == "first" else math.inf,
        "stop_len": max_len,
    }
    return [float(values[name]) for name in PARAMS]


MIN_OPSET = 13
# the names the search's inputs and outputs take in the merged graph (besides the decoder's own
# tokens, reorder, state, values, keys, mask and new_state)
SEARCH_NAMES = (
    "sentences", "settings", "row_base", "history", "attention_history", "attention_shape",
    "out_sentences", "out_tokens", "out_reorder", "done", "out_history", "out_attention_history",
    "blocked", "forced", "coverage", "row_select", "coverage_ends", "coverage_pads",
    "out_coverage",
)  # fmt: skip


@dataclass(frozen=True)
class SearchVariant:
    """What a search graph is built for: K slots a sentence, k candidates a slot, the end of
    sentence, the start token, and the beam rule (narrow_on_eos: only the non-EOS candidates among
    the top `width` continue, the imported toolkits' rule); and what the batch's sentences need,
    each kept only while one of them needs it (each costs the others): the coverage (a sentence
    has a coverage penalty: (N, S) work a step), the controls (a sentence has controls the graph
    applies: they touch the step's whole log-softmax row), the attention rows (a sentence returns
    its alignment: (N, S) written a step), and its `keep` best finished scores (wide: a sentence
    returns more than one hypothesis; else the best one is all the stopping rules read)."""

    K: int
    k: int
    bos_id: int
    eos_id: int
    narrow_on_eos: bool = False
    coverage: bool = False
    controls: bool = False
    attention: bool = True
    wide: bool = False

    @property
    def M(self) -> int:
        """Candidates ranked per sentence: 2K, or all of them when fewer."""
        return min(2 * self.K, self.K * self.k)


NEEDS: tuple[str, ...] = ("coverage", "controls", "attention", "wide")  # SearchVariant's


def same_beam(a: SearchVariant, b: SearchVariant) -> bool:
    """Whether two variants differ at most in what their sentences need (NEEDS)."""
    return replace(a, **{n: False for n in NEEDS}) == replace(b, **{n: False for n in NEEDS})


def covers_needs(variant: SearchVariant, needed: SearchVariant) -> bool:
    """Whether `variant` does everything `needed` does (the same beam)."""
    return same_beam(variant, needed) and all(
        getattr(variant, n) or not getattr(needed, n) for n in NEEDS
    )


def extra_needs(variant: SearchVariant) -> int:
    """How many of NEEDS a variant does (a rank among those that cover a batch: the fewest
    costs its batch least)."""
    return sum(bool(getattr(variant, n)) for n in NEEDS)


def full(variant: SearchVariant, controls: bool) -> SearchVariant:
    """The variant of `variant`'s beam that does every need (the controls where the graph takes
    them)."""
    return replace(variant, coverage=True, controls=controls, attention=True, wide=True)
