"""The beam search's step as ONNX nodes, appended to the decoder step at load: one run of the
result takes the previous beam to the next one, on the session's device.

`service/decode/search/beam.py` says what a step decides (it stays the reference and the host path); this
module writes the same decisions as a graph, and `service/decode/search/device_search.py` drives it. One
run of `search_step_graph(decoder, variant)`:

1. **the decoder step** — the model's own graph, fed the previous step's `tokens` and `reorder`
   (its back-pointers) as they are; its k is a constant (K + 1, or V); with the `controls` variant,
   its log-softmax row masked before its TopK and the prefix's forced tokens put in its place
   (`_controls`);
2. **the candidates** — the K·k extensions of each sentence scored (float64, as the numpy search:
   the same sums, the same ties), the best M = 2K of them sorted (ONNX TopK: lower indices first on
   ties, like numpy's stable argsort; 2K suffice, as each slot has one end of sentence at most);
3. **the next beam** — the first K non-EOS candidates in rank order fill the K slots (a TopK over
   distinct keys); a slot lives when it is within the sentence's `width` (or, for the imported
   toolkits' rule, when its candidate ranks within it) and its score is finite: the numpy search's
   wanted candidates, in its slots;
4. **the n-best lists** — the end-of-sentence candidates among each sentence's top `width`, and
   at the maximum length every live slot, scored (GNMT's length and coverage penalties, Marian's
   normalization and word penalty) and merged into each sentence's best `keep` (a TopK with the
   `wide` or `coverage` variant; else each keeps one, and without a coverage penalty a step's best
   end is its first in rank order, its best cut its first live slot: a few row operations);
5. **the stopping rules** — exact, first, patience, narrowing, as thresholds per sentence: a `done`
   flag per sentence, the one thing the host reads after a step;
6. **the history** — each slot's token and back-pointer, its token's log-prob and the attention
   row that produced it, written in place into preallocated buffers (one row per sentence of a
   pool, one column per step): nothing of it crosses to the host until the sentence finishes.

Between steps a sentence is one column of `sentences` (W, B) float64 (`sentence_width`: its
steps, ended and top-ended counts, its n-best list, its slots' cumulative scores) and K rows of
`tokens` and `reorder` (N,) int64, the decoder's own inputs; its settings are a column of
`settings` (len(PARAMS), B) float64, an input only (they never change). The step does not pick its
sentences: joins and leaves happen between steps, on these tensors (`DeviceSearch._select`: numpy
where the device's memory is the host's, `select_graph` elsewhere), so a step where nobody joined or
left costs nothing for them. The candidates are ranked a row per sentence, as the decoder's outputs
come; the rest is laid out sentence-last ((M, B), (K, B), (1, B)), where ONNX Runtime's CPU kernels
broadcast a sentence's settings cheaply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from service.decode.runtime.graph_nodes import (
    BOOL,
    DOUBLE,
    FLOAT,
    INT64,
    Nodes,
    opset_of,
    topological,
    used,
)
from service.decode.runtime.search_variant import (
    BIG,
    CODE,
    MAX_BEAM,
    MIN_OPSET,
    PARAMS,
    SEARCH_NAMES,
    SENTENCE_FIELDS,
    STOP,
    SearchVariant,
)
from service.decode.shared.rules import (
    COVERAGE_FLOOR,
)


def sentence_width(K: int) -> int:
    """W: a sentence's fields in `sentences` (W, B): steps, ended, top ended; its finished
    hypotheses, best first (K scores, -inf where none; K log-probs; K codes); its slots'
    cumulative scores (K)."""
    return SENTENCE_FIELDS + 4 * K


def scores_topk(graph: onnx.GraphProto) -> onnx.NodeProto | None:
    """The decoder's TopK over its log-softmax row (the contract's log_probs come from it)."""
    return next((n for n in graph.node if n.op_type == "TopK" and "log_probs" in n.output), None)


def controls_problem(model: onnx.ModelProto) -> str | None:
    """Why the controls cannot be applied in this decoder graph: they mask its whole log-softmax
    row before its TopK, which must be the one producing log_probs."""
    if scores_topk(model.graph) is None:
        return "no TopK produces the decoder graph's log_probs"
    return None


def graph_problem(model: onnx.ModelProto, K: int) -> str | None:
    """Why the search cannot be appended to this decoder graph (None when it can)."""
    opset = opset_of(model)
    if opset < MIN_OPSET:
        return f"the decoder graph's opset {opset} is below {MIN_OPSET}"
    if K > MAX_BEAM:
        return f"beam size {K} is over the device search's {MAX_BEAM}"
    names = {i.name for i in model.graph.input}
    missing = {"tokens", "state", "reorder", "k", "mask"} - names
    if missing:
        return f"the decoder graph has no inputs {sorted(missing)}"
    return None


def search_step_graph(decoder: onnx.ModelProto, variant: SearchVariant) -> onnx.ModelProto:
    """The decoder step with the search's step after it (the module's docstring): a new model;
    `decoder` is not changed. Its inputs: the decoder's tokens, reorder, state, values, keys,
    mask, and

    - sentences (W, B) f64: the previous step's out_sentences (after the joins and leaves);
      settings (len(PARAMS), B) f64: the sentences' settings; row_base (1, B) int64: b·K;
    - history (P, L, 2, K) f32 and, with the attention variant,
      attention_history (P, L, K, S) f32, bound in place with out_history and
      out_attention_history (a sentence writes its pool row, its step's column); attention_shape
      (3,) int64 (host): B, K, S;
    - with controls: blocked (P_blocked, 2), forced (N,) int64;
    - with coverage: coverage (N_prev, S_prev) f32, row_select (N,) int64 into its rows (past
      N_prev: a joining sentence's, zeros), coverage_ends (1,), coverage_pads (4,) int64 (host):
      the coverage fitted to this step's source axis S.

    Its outputs: out_tokens, out_reorder (N,) int64, out_sentences (W, B), new_state (N, D), done
    (B,) bool, out_history (and out_attention_history, out_coverage (N, S)).

    The candidates are ranked sentence-major ((B, K·k): a TopK row per sentence, as the decoder's
    outputs come); the rest is laid out sentence-last ((M, B), (K, B), (1, B)): ONNX Runtime's CPU
    kernels broadcast a (1, B) row over K rows in K vector operations, but a (B, 1) column over
    (B, K) in B of them (measured: 1 µs against 7 for an add at 1,024 sentences)."""
    g = Nodes("search/", opset_of(decoder))
    if variant.controls:
        _controls(g, variant)
    batch = _unpack(g, variant)
    cands = _candidates(g, variant, batch)
    beam = _next_beam(g, variant, batch, cands)
    penalty = _coverage_penalties(g, variant, batch, cands, beam) if variant.coverage else None
    ends = _finished(g, variant, batch, cands, beam, penalty)
    _stopping(g, batch, beam, ends)
    _history(g, variant, batch, beam)
    return merge_decoder(decoder, g, variant)


@dataclass(frozen=True)
class _Batch:
    """This step's sentences: fields (1, B) each; finished hypotheses (their scores, log-probs and
    codes: (K, B) each, or with neither the wide nor the coverage variant, the first's (1, B) and
    the others' (K - 1, B) apart); slots' scores (K, B); settings (1, B) each, by name."""

    steps: str
    ended: str
    top_ended: str
    nbest: list[str]
    scores: str
    p: dict[str, str]


def _unpack(g: Nodes, variant: SearchVariant) -> _Batch:
    """The sentences' fields and settings, as rows."""
    K = variant.K
    if variant.wide or variant.coverage:
        nb = [K, K, K]
    else:  # each of the three blocks split in its first row and the others (rank >= 1)
        nb = [1, K - 1, 1, K - 1, 1, K - 1] if K > 1 else [1, 1, 1]
    sizes = [1, 1, 1, *nb, K]
    fields = g.ops("Split", "sentences", g.const(sizes, np.int64), outputs=len(sizes), axis=0)
    nbest = fields[3:-1]
    if len(nb) == 6:  # firsts, then the others
        nbest = [nbest[0], nbest[2], nbest[4], nbest[1], nbest[3], nbest[5]]
    singles = len(PARAMS) - STOP
    counts = g.const([1] * singles + [STOP], np.int64)
    rows = g.ops("Split", "settings", counts, outputs=singles + 1, axis=0)  # (1, B) each; (4, B)
    steps, ended, top_ended = fields[:3]
    settings = dict(zip(PARAMS[:singles], rows[:singles], strict=True))
    settings["stop"] = rows[-1]
    return _Batch(steps, ended, top_ended, nbest, fields[-1], settings)


def _controls(g: Nodes, variant: SearchVariant) -> None:
    """The masks and the forced tokens (service/decode/shared/controls.py's, on the device): the
    (row, token) pairs `blocked` (P, 2) set to -inf in the step's log-softmax row before its TopK
    (suppressed tokens, the end of sentence before the minimum length); a row's `forced` (N,)
    token (a prefix's, -1 for none) is its only candidate, at the model's log-prob."""
    k = variant.k
    blocked_count = g.op(
        "Slice", g.op("Shape", "blocked"), g.const([0], np.int64), g.const([1], np.int64)
    )  # (1,) P
    minus_inf = helper.make_tensor("minus_inf", FLOAT, [1], [-np.inf])
    masked = g.op(
        "ScatterND",
        "search/scores",
        "blocked",
        g.op("ConstantOfShape", blocked_count, value=minus_inf),
        out="search/masked",
    )  # (N, V): in place where ONNX Runtime can (the row has no other reader)
    forced = g.reshape("forced", -1, 1)  # (N, 1)
    is_forced = g.op("GreaterOrEqual", forced, g.const(0, np.int64))  # (N, 1)
    token = g.op("Max", forced, g.const(0, np.int64))  # (N, 1) a valid index for every row
    value = g.op("GatherElements", masked, token, axis=1)  # (N, 1) the model's log-prob
    rest = g.op(
        "Concat", g.op("Slice", g.op("Shape", forced), g.const([0], np.int64),
                       g.const([1], np.int64)), g.const([k - 1], np.int64), axis=0,
    )  # fmt: skip  # (2,) N, k - 1
    no_values = g.op("ConstantOfShape", rest, value=minus_inf)  # (N, k - 1)
    no_ids = g.op("ConstantOfShape", rest, value=helper.make_tensor("z", INT64, [1], [0]))
    g.op(
        "Where", is_forced, g.op("Concat", value, no_values, axis=1), "search/top_log_probs",
        out="search/log_probs",
    )  # fmt: skip  # (N, k)
    g.op(
        "Where", is_forced, g.op("Concat", token, no_ids, axis=1), "search/top_ids",
        out="search/token_ids",
    )  # fmt: skip


@dataclass(frozen=True)
class _Candidates:
    """Each sentence's best M candidates, best first: (M, B) each."""

    scores: str  # f64 cumulative
    index: str  # int64 among the sentence's K·k: slot · k + rank in the slot
    token: str  # int64
    is_eos: str  # bool
    head_slot: str  # (K, B) int64 the slots the first K extend (wide or coverage shapes)


def _candidates(g: Nodes, variant: SearchVariant, batch: _Batch) -> _Candidates:
    """2. Each slot's k extensions scored (float64: the slot's score plus the token's float32
    log-prob, as numpy adds them), each sentence's best M (beam.py's _rank_candidates)."""
    K, k, M = variant.K, variant.k, variant.M
    log_probs = g.cast("search/log_probs", DOUBLE)  # (N, k)
    scores = g.reshape(g.op("Transpose", batch.scores), -1, 1)  # (N, 1) the slots' scores
    # a (N, 1) column added to (N, k) is N short loops in ONNX Runtime's CPU kernels; as a
    # product with a row of ones (Gemm's C added) it is one call, the same sums
    candidates = g.op("Gemm", scores, g.const(np.ones((1, k))), log_probs)  # (N, k) f64
    top, index = g.ops(
        "TopK", g.reshape(candidates, -1, K * k), g.const([M], np.int64), outputs=2, axis=1
    )  # (B, M) each, best first, ties by index
    token = g.op("GatherElements", g.reshape("search/token_ids", -1, K * k), index, axis=1)
    top, index, token = (g.op("Transpose", x) for x in (top, index, token))  # (M, B)
    is_eos = g.op("Equal", token, g.const(variant.eos_id, np.int64))  # (M, B)
    head_slot = ""
    if variant.wide or variant.coverage:  # the general merge and the coverage read them
        head_slot = g.op(
            "Div", g.op("Slice", index, g.const([0], np.int64), g.const([K], np.int64)),
            g.const(k, np.int64),
        )  # fmt: skip  # (K, B)
    return _Candidates(top, index, token, is_eos, head_slot)


@dataclass(frozen=True)
class _Beam:
    """The next beam: (K, B) each."""

    scores: str  # f64, -inf for dead slots
    slot: str  # int64 the previous slot each continues
    token: str  # int64
    log_prob: str  # f32 the model's log-prob of its token
    rows: str  # (N,) int64 rows of this step's output each continues (out_reorder)
    in_width: str  # bool (K, B): rank j < width


def _next_beam(g: Nodes, variant: SearchVariant, batch: _Batch, c: _Candidates) -> _Beam:
    """3. Slot j takes the (j+1)-th non-EOS candidate (there are K among the best 2K): a TopK over
    keys that put the non-EOS ones first, in rank order (distinct keys, so no tie decides); it
    lives within the sentence's width (beam.py's _continuations: its wanted candidates are the
    first `width` of these, or, under the imported toolkits' rule, those ranked within the top
    `width`) with a finite score: a dead slot's score is -inf. Its token and back-pointer are the
    decoder's next inputs."""
    K, M, k = variant.K, variant.M, variant.k
    p = batch.p
    ranks = np.arange(M, dtype=np.float32)[:, None]  # (M, 1)
    key = g.op("Where", c.is_eos, g.const(ranks + M, np.float32), g.const(ranks, np.float32))
    _, pick = g.ops("TopK", key, g.const([K], np.int64), outputs=2, axis=0, largest=0)  # (K, B)

    def picked(x: str) -> str:
        return g.op("GatherElements", x, pick, axis=0)

    scores, index, token = picked(c.scores), picked(c.index), picked(c.token)  # (K, B)
    slot = g.op("Div", index, g.const(k, np.int64))
    log_prob = g.op(
        "Transpose",
        g.op(
            "GatherElements", g.reshape("search/log_probs", -1, K * k), g.op("Transpose", index),
            axis=1,
        ),
    )  # fmt: skip  # (K, B) f32
    # rank j within the width: j < beam - narrowing · min(ended, beam) (beam.py's
    # _Sentence.width), that is j + narrowing · ended < beam
    narrowed = g.op("Mul", p["narrowing"], batch.ended)  # (1, B)
    in_width = g.op(
        "Less", g.op("Add", g.const(np.arange(K, dtype=np.float64)[:, None]), narrowed), p["beam"]
    )  # (K, B)
    within = in_width
    if variant.narrow_on_eos:  # the candidate's own rank within the width
        within = g.op("Less", g.op("Add", g.cast(pick, DOUBLE), narrowed), p["beam"])
    parents = g.op("Add", slot, "row_base")  # (K, B) rows of this step's output
    rows = g.op("Reshape", g.op("Transpose", parents), g.const([-1], np.int64), out="out_reorder")
    g.op("Reshape", g.op("Transpose", token), g.const([-1], np.int64), out="out_tokens")  # (N,)
    return _Beam(
        scores=g.op("Where", within, scores, g.const(-np.inf)),
        slot=slot,
        token=token,
        log_prob=log_prob,
        rows=rows,
        in_width=in_width,
    )


def _coverage_penalties(
    g: Nodes, variant: SearchVariant, batch: _Batch, c: _Candidates, beam: _Beam
) -> tuple[str, str]:
    """β · Σ log(clip(coverage, COVERAGE_FLOOR, 1)) over each sentence's own source positions
    (beam.py's coverage_penalty: the sum in float32, then β in float64), of the head candidates
    (K, B) and of the next beam's slots (K, B): a row's coverage with this step's attention, its
    parent's for a slot that continues. The coverage itself: the previous step's rows picked by
    row_select (joining rows: zeros), fitted to this step's source axis."""
    K = variant.K
    zeros = g.op("ConstantOfShape", g.op(
        "Concat", g.op("Slice", g.op("Shape", "row_select"), g.const([0], np.int64),
                       g.const([1], np.int64)),
        g.op("Slice", g.op("Shape", "coverage"), g.const([1], np.int64),
             g.const([2], np.int64)), axis=0),
        value=helper.make_tensor("zero", FLOAT, [1], [0.0]))  # fmt: skip
    coverage = g.op(
        "Gather", g.op("Concat", "coverage", zeros, axis=0), "row_select", axis=0
    )  # (N, S_prev): rows past N_prev are the joining ones' (zeros)
    coverage = g.op(
        "Pad",
        g.op("Slice", coverage, g.const([0], np.int64), "coverage_ends", g.const([1], np.int64)),
        "coverage_pads",
    )  # (N, S)
    step_coverage = g.op("Add", coverage, "search/attention")  # (N, S)
    g.op("Gather", step_coverage, beam.rows, axis=0, out="out_coverage")
    mask = g.op(
        "Reshape",
        g.op("Expand", g.op("Unsqueeze", "mask", g.const([1], np.int64)),
             g.op("Concat", g.const([1, K], np.int64),
                  g.op("Slice", g.op("Shape", "mask"), g.const([1], np.int64),
                       g.const([2], np.int64)), axis=0)),
        g.op("Shape", step_coverage),
    )  # fmt: skip  # (N, S) bool: each row's sentence's positions
    clipped = g.op(
        "Clip", step_coverage, g.const(COVERAGE_FLOOR, np.float32), g.const(1.0, np.float32)
    )
    logs = g.op("Where", mask, g.op("Log", clipped), g.const(0.0, np.float32))  # (N, S)
    sums = g.reduce_sum(logs, 1, keepdims=0)  # (N,) the sum in float32
    per_slot = g.op("Transpose", g.reshape(g.cast(sums, DOUBLE), -1, K))  # (K, B)

    def of(slots: str) -> str:
        return g.op("Mul", batch.p["beta"], g.op("GatherElements", per_slot, slots, axis=0))

    return of(c.head_slot), of(beam.slot)


@dataclass(frozen=True)
class _Ends:
    """What finished at this step, and the sentences' finished hypotheses after it."""

    ended: str  # (1, B) f64 hypotheses ended so far
    top_ended: str  # (1, B) f64 1: a step's best-ranked candidate ended
    nbest: list[str]  # out_sentences' rows between top_ended and the slots' scores
    worst: str  # (1, B) f64 the keep-th best finished score (-inf until keep finished)
    steps: str  # (1, B) f64 steps taken, this one included
    spent: str  # (1, B) f64 the word penalty of those steps
    best_live: str  # (1, B) f64 the first slot's score: the best live one (-inf: none)


def _finished(
    g: Nodes,
    variant: SearchVariant,
    batch: _Batch,
    c: _Candidates,
    beam: _Beam,
    penalty: tuple[str, str] | None,
) -> _Ends:
    """4. The end-of-sentence candidates among the top `width` (they lie in the head: the first
    K ranks) and, at the maximum length, the live slots, scored as beam.py's _Sentence.finish
    does, merged into each sentence's finished hypotheses (its `keep` best: score, log-prob,
    code = slot + CODE·(2·prefix_steps + by_eos)), the earlier first on ties as its stable sort."""
    K = variant.K
    p, neg_inf = batch.p, g.const(-np.inf)
    steps = g.op("Add", batch.steps, g.const(1.0))  # (1, B) steps taken, this one included
    lp = g.op(
        "Mul",
        g.op("Pow", g.op("Div", g.op("Add", steps, g.const(5.0)), g.const(6.0)), p["alpha"]),
        g.op("Pow", steps, p["normalize"]),
    )  # (1, B) GNMT's lp times Marian's length^normalize
    spent = g.op("Mul", p["word_penalty"], steps)  # (1, B)

    def normalized(scores: str, cp: str | None = None) -> str:
        score = g.op("Div", g.op("Sub", scores, spent), lp)
        return score if cp is None else g.op("Add", score, cp)

    first, upto_K, axis0 = g.const([0], np.int64), g.const([K], np.int64), g.const([0], np.int64)
    one = g.const([1], np.int64)
    head_scores = g.op("Slice", c.scores, first, upto_K, axis0)  # (K, B)
    head_eos = g.op("Slice", c.is_eos, first, upto_K, axis0)
    ends = g.op(
        "And", g.op("And", head_eos, beam.in_width), g.op("Greater", head_scores, neg_inf)
    )  # (K, B): EOS among the top width, finite
    ends_f = g.cast(ends, DOUBLE)
    ended = g.op("Add", batch.ended, g.reduce_sum(ends_f, 0))  # (1, B)
    top_ended = g.op("Max", batch.top_ended, g.op("Slice", ends_f, first, one, axis0))  # (1, B)
    at_max = g.op("GreaterOrEqual", steps, p["max_len"])  # (1, B)
    best_live = g.op("Slice", beam.scores, first, one, axis0)  # (1, B) slots are in rank order
    eos_base = g.op("Add", g.op("Mul", batch.steps, g.const(2.0 * CODE)), g.const(1.0 * CODE))
    max_base = g.op("Mul", steps, g.const(2.0 * CODE))  # (1, B): CODE·(2·prefix + by_eos)
    nb_scores, nb_log_probs, nb_codes = batch.nbest[:3]
    if variant.wide or variant.coverage:  # the K best of the kept, the ends and the cut, by TopK
        eos_scores = g.op(
            "Where", ends, normalized(head_scores, penalty and penalty[0]), neg_inf
        )  # (K, B)
        live = g.op("Greater", beam.scores, neg_inf)
        max_scores = g.op(
            "Where",
            g.op("And", at_max, live),
            normalized(beam.scores, penalty and penalty[1]),
            neg_inf,
        )  # (K, B)
        eos_codes = g.op("Add", g.cast(c.head_slot, DOUBLE), eos_base)
        max_codes = g.op("Add", g.const(np.arange(K, dtype=np.float64)[:, None]), max_base)
        merged = g.op("Concat", nb_scores, eos_scores, max_scores, axis=0)  # (3K, B)
        best, where = g.ops("TopK", merged, upto_K, outputs=2, axis=0)  # (K, B)
        log_probs = g.op("Concat", nb_log_probs, head_scores, beam.scores, axis=0)
        codes = g.op("Concat", nb_codes, eos_codes, max_codes, axis=0)
        nbest = [
            best,
            g.op("GatherElements", log_probs, where, axis=0),
            g.op("GatherElements", codes, where, axis=0),
        ]
        rank = g.cast(g.op("Sub", p["keep"], g.const(1.0)), INT64)  # (1, B)
        worst = g.op("GatherElements", best, rank, axis=0)
    else:  # every sentence keeps one: the best of its best, this step's best end and best cut
        nbest = _one_kept(g, variant, batch, c, normalized, ends, head_scores, at_max, best_live,
                          (neg_inf, eos_base, max_base))  # fmt: skip
        worst = nbest[0]
    return _Ends(ended, top_ended, nbest, worst, steps, spent, best_live)


def _one_kept(
    g: Nodes,
    variant: SearchVariant,
    batch: _Batch,
    c: _Candidates,
    normalized: Callable[[str], str],
    ends: str,
    head_scores: str,
    at_max: str,
    best_live: str,
    consts: tuple[str, str, str],
) -> list[str]:
    """The finished hypotheses of sentences that keep one: the best of the kept one, this step's
    best end and its best cut (`_finished` without the `wide` and `coverage` variants); consts:
    -inf, and the codes' bases of an end and of a cut."""
    K, k = variant.K, variant.k
    neg_inf, eos_base, max_base = consts
    nb_scores, nb_log_probs, nb_codes = batch.nbest[:3]
    # without a coverage penalty a step's normalized scores follow its cumulative ones: the
    # first end in rank order and the first live slot are this step's best (ties: the first)
    ranks = g.const(np.arange(K, dtype=np.float64)[:, None])  # (K, 1)
    j = g.reduce("ReduceMin", g.op("Where", ends, ranks, g.const(K - 1.0)), 0)  # (1, B)
    j = g.cast(j, INT64)  # the first end's rank (any, without one: its score is -inf)
    eos_log_prob = g.op(
        "GatherElements", g.op("Where", ends, head_scores, neg_inf), j, axis=0
    )  # (1, B)
    eos_slot = g.op("Div", g.op("GatherElements", c.index, j, axis=0), g.const(k, np.int64))
    eos_code = g.op("Add", g.cast(eos_slot, DOUBLE), eos_base)
    max_best = g.op("Where", at_max, normalized(best_live), neg_inf)  # (1, B) slot 0's
    best, best_log_prob, best_code = nb_scores, nb_log_probs, nb_codes
    for score, log_prob, code in (
        (normalized(eos_log_prob), eos_log_prob, eos_code),
        (max_best, best_live, max_base),
    ):
        better = g.op("Greater", score, best)  # strictly: the earlier stays on ties
        best = g.op("Where", better, score, best)
        best_log_prob = g.op("Where", better, log_prob, best_log_prob)
        best_code = g.op("Where", better, code, best_code)
    rest = batch.nbest[3:]  # the kept hypotheses past the first (K > 1): as they were
    nbest = [best, *rest[:1], best_log_prob, *rest[1:2], best_code, *rest[2:3]]
    return nbest


def _stopping(g: Nodes, batch: _Batch, beam: _Beam, e: _Ends) -> None:
    """5. done (B,): dead (no live slot), at the maximum length, or its stopping rule met with its
    n-best full (beam.py's _Sentence.done), each rule a threshold its value reaches (PARAMS'
    last STOP rows): exact compares the keep-th finished score with the best a live hypothesis
    can still score (a dead sentence's bound is -inf: it stops under any rule), patience and
    narrowing count the ended hypotheses, first adds whether a best candidate ended, and the
    steps reach the maximum length."""
    p = batch.p
    bound = g.op(
        "Div", g.op("Sub", g.op("Sub", e.best_live, e.spent), p["word_penalty"]), p["max_lp"]
    )  # (1, B) the best a live hypothesis can still score: one more step at least
    values = g.op(
        "Concat",
        g.op("Sub", g.op("Max", e.worst, g.const(-BIG)), bound),
        e.ended,
        g.op("Add", g.op("Mul", e.top_ended, g.const(BIG)), e.ended),
        e.steps,
        axis=0,
    )  # (STOP, B)
    met = g.cast(g.op("GreaterOrEqual", values, p["stop"]), FLOAT)  # (STOP, B)
    stop = (
        g.op("ReduceMax", met, g.const([0], np.int64), keepdims=0)
        if g.opset >= 18
        else g.op("ReduceMax", met, axes=[0], keepdims=0)
    )  # (B,)
    g.op("Cast", stop, to=BOOL, out="done")
    g.op(
        "Concat", e.steps, e.ended, e.top_ended, *e.nbest, beam.scores, axis=0,
        out="out_sentences",
    )  # fmt: skip  # (W, B)


def _history(g: Nodes, variant: SearchVariant, batch: _Batch, beam: _Beam) -> None:
    """6. Each sentence's column of the history: its slots' codes (token · CODE + back-pointer)
    and their tokens' log-probs (`history` (P, L, 2, K) float32) and, with the attention variant,
    this step's attention rows (those of the previous beam's slots: `attention_history`
    (P, L, K, S) is on this step's source axis), written in place at its pool row and step."""
    code = g.op("Add", g.op("Mul", beam.token, g.const(CODE, np.int64)), beam.slot)  # (K, B)
    fields = g.op("Concat", g.cast(code, FLOAT), beam.log_prob, axis=0)  # (2K, B)
    fields = g.reshape(g.op("Transpose", fields), -1, 2, variant.K)  # (B, 2, K)
    index = g.cast(
        g.op("Transpose", g.op("Concat", batch.p["pool"], batch.steps, axis=0)), INT64
    )  # (B, 2): the sentence's pool row, its step
    g.op("ScatterND", "history", index, fields, out="out_history")
    if variant.attention:
        attention = g.op("Reshape", "search/attention", "attention_shape")  # (B, K, S)
        g.op("ScatterND", "attention_history", index, attention, out="out_attention_history")


def search_scores_output(variant: SearchVariant) -> str:
    """The search graph's name for the values of the decoder's TopK over its log-softmax row."""
    return "search/top_log_probs" if variant.controls else "search/log_probs"


def merge_decoder(decoder: onnx.ModelProto, g: Nodes, variant: SearchVariant) -> onnx.ModelProto:
    """The decoder graph followed by g's nodes: k a constant, its outputs internal but new_state;
    then g's nodes, inputs, outputs. Values of the decoder named like the search's move aside
    (decoder/...)."""
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    graph = model.graph
    _rename_decoder_values(graph, variant)
    new_state = next(o for o in graph.output if o.name == "new_state")
    declared = [o for o in graph.output if o.name.startswith("new_") and o.name != "new_state"]
    del graph.output[:]
    outputs = {"out_tokens", "out_reorder", "out_sentences", "new_state", "done", "out_history"}
    outputs |= {o.name for o in declared}
    if variant.attention:
        outputs.add("out_attention_history")
    if variant.coverage:
        outputs.add("out_coverage")
    nodes = used(topological([*graph.node, *g.nodes]), outputs)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(g.inits)
    read = {i for node in nodes for i in node.input}
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    _declare_search_values(graph, variant, new_state, declared)
    onnx.checker.check_model(model)
    return model


def _rename_decoder_values(graph: onnx.GraphProto, variant: SearchVariant) -> None:
    """The decoder's values named like the search's moved aside (decoder/...), its k a constant,
    its positions computed from the sentences' steps."""
    rename = {
        "log_probs": "search/log_probs",
        "token_ids": "search/token_ids",
        "attention": "search/attention",
    }
    if variant.controls:  # the TopK reads the masked row; the forced tokens follow it
        topk = scores_topk(graph)
        assert topk is not None, "controls_problem checks it first"
        rename[topk.input[0]] = "search/scores"
        topk.input[0] = "search/masked"
        topk.output[:] = [search_scores_output(variant), "search/top_ids"]
    k_input = next(i for i in graph.input if i.name == "k")
    k_dims = len(k_input.type.tensor_type.shape.dim)
    internal = {o for node in graph.node for o in node.output} | {i.name for i in graph.initializer}
    taken = set(SEARCH_NAMES)
    rename.update({n: f"decoder/{n}" for n in internal & taken if n not in rename})
    for init in graph.initializer:
        init.name = rename.get(init.name, init.name)
    for node in graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    reads_positions = any(i.name == "positions" for i in graph.input)
    kept_inputs = [i for i in graph.input if i.name not in ("k", "positions")]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    k_value = np.full((1,) * k_dims, variant.k, np.int64)
    graph.initializer.append(
        helper.make_tensor("k", INT64, k_value.shape, k_value.ravel().tolist())
    )
    if reads_positions:  # each row's tokens decoded so far: its sentence's steps
        graph.node.extend(_positions(variant.K))


def _declare_search_values(
    graph: onnx.GraphProto,
    variant: SearchVariant,
    new_state: onnx.ValueInfoProto,
    declared: list[onnx.ValueInfoProto],
) -> None:
    """The merged graph's inputs and outputs: the decoder's state, the search's, the variant's."""
    W = sentence_width(variant.K)
    vi = helper.make_tensor_value_info
    graph.input.extend(
        [
            vi("sentences", DOUBLE, [W, "B"]),
            vi("settings", DOUBLE, [len(PARAMS), "B"]),
            vi("row_base", INT64, [1, "B"]),
            vi("history", FLOAT, ["P", "L", 2, variant.K]),
        ]
    )
    graph.output.extend(
        [
            vi("out_tokens", INT64, ["N"]),
            vi("out_reorder", INT64, ["N"]),
            vi("out_sentences", DOUBLE, [W, "B"]),
            new_state,
            *declared,
            vi("done", BOOL, ["B"]),
            vi("out_history", FLOAT, ["P", "L", 2, variant.K]),
        ]
    )
    if variant.attention:
        graph.input.extend(
            [
                vi("attention_history", FLOAT, ["P", "L", variant.K, "S"]),
                vi("attention_shape", INT64, [3]),
            ]
        )
        graph.output.append(vi("out_attention_history", FLOAT, ["P", "L", variant.K, "S"]))
    if variant.controls:
        graph.input.extend([vi("blocked", INT64, ["P_blocked", 2]), vi("forced", INT64, ["N"])])
    if variant.coverage:
        graph.input.extend(
            [
                vi("coverage", FLOAT, ["N_prev", "S_prev"]),
                vi("row_select", INT64, ["N"]),
                vi("coverage_ends", INT64, [1]),
                vi("coverage_pads", INT64, [4]),
            ]
        )
        graph.output.append(vi("out_coverage", FLOAT, ["N", "S"]))


def _positions(K: int) -> list[onnx.NodeProto]:
    """The decoder's `positions` (N,) int64 from the search's `sentences` (W, B): each sentence's
    steps (its first field) for each of its K rows."""
    n = helper.make_node
    return [
        n("Constant", [], ["positions/zero"], value=helper.make_tensor("z", INT64, [1], [0])),
        n("Constant", [], ["positions/one"], value=helper.make_tensor("o", INT64, [1], [1])),
        n("Slice", ["sentences", "positions/zero", "positions/one", "positions/zero"],
          ["positions/steps"]),  # (1, B) float64
        n("Cast", ["positions/steps"], ["positions/int"], to=INT64),
        n("Transpose", ["positions/int"], ["positions/column"]),  # (B, 1)
        n("Constant", [], ["positions/shape"],
          value=helper.make_tensor("s", INT64, [2], [1, K])),
        n("Tile", ["positions/column", "positions/shape"], ["positions/rows"]),  # (B, K)
        n("Constant", [], ["positions/flat"], value=helper.make_tensor("f", INT64, [1], [-1])),
        n("Reshape", ["positions/rows", "positions/flat"], ["positions"]),  # (N,)
    ]  # fmt: skip
