"""The beam search's step as ONNX nodes, appended to the decoder step at load: one run of the
result takes the previous beam to the next one, on the session's device.

`service/decode/beam.py` says what a step decides (it stays the reference and the host path); this
module writes the same decisions as a graph, and `service/decode/device_search.py` drives it. One
run of `search_step_graph(decoder, shape)`:

1. **The batch's membership** — the sentences are picked (`sent_select`) from the previous step's
   outputs and the joining sentences' initial fields (the compaction when sentences leave, the
   join when they arrive: an index array, on the device); the decoder's tokens and back-pointers
   are unpacked from them;
2. **the decoder step** — the model's own graph, its `tokens`, `reorder` and `k` now fed by the
   nodes above (k is a constant: K + 1, or V); with the `controls` shape, its log-softmax row
   masked before its TopK and the prefix's forced tokens put in its place (`_controls`);
3. **the candidates** — the K·k extensions of each sentence scored (float64, as the numpy search:
   the same sums, the same ties), the best 2K of them sorted (ONNX TopK: lower indices first on
   ties, like numpy's stable argsort; 2K suffice, as each slot has one end of sentence at most);
4. **the next beam** — the end-of-sentence candidates among each sentence's top `width` finish,
   the `width` best others continue (or, for imported toolkits' rule, those among the top
   `width`), their back-pointers, scores and model log-probs (and, with the `coverage` shape, the
   coverage) gathered;
5. **the n-best lists** — finished hypotheses scored (GNMT's length and coverage penalties,
   Marian's normalization and word penalty) and merged into each sentence's best `keep`; at the
   maximum length the live slots finish as they are;
6. **the stopping rules** — exact, first, patience, narrowing: a `done` flag per sentence, the one
   thing the host reads after a step;
7. **the history** — each slot's token and back-pointer, its token's log-prob and the attention row
   that produced it, written in place into preallocated buffers (one row per sentence of a pool,
   one column per step): nothing of it crosses to the host until the sentence finishes.

A sentence's state between steps is one column of `sentences` (W, B) float64 (`sentence_width`: its
steps, ended and top-ended counts, its n-best's scores, log-probs and codes, its slots' tokens,
back-pointers, scores and log-probs, its settings and stopping rule; integers are exact in
float64): one tensor is one binding, and a binding costs the host more than the nodes that unpack
it. Per-sentence work is laid out sentence-last ((M, B), (K, B), (1, B)), which ONNX Runtime's CPU
kernels broadcast cheaply. The history is two buffers: (P, L, 2, K) float32 (code = token * CODE +
back-pointer, the token's log-prob) and (P, L, K, S) float32 (the attention rows, on the batch's
source axis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

FLOAT, DOUBLE, INT64, BOOL = (
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.INT64,
    TensorProto.BOOL,
)
CODE = 32  # a history code is token * CODE + slot: beams of up to CODE slots
MAX_BEAM = CODE
COVERAGE_FLOOR = 1e-6  # beam.COVERAGE_FLOOR (not imported: beam.py stays free of graphs)
SENTENCE_FIELDS = 3  # a sentence's steps, ended, top ended; then its n-best's and slots' fields
SLOT_FIELDS = ("token", "parent", "score", "raw")  # per slot, after the n-best's 3K fields
# a sentence's settings (rows of `sentences` after its slots), written by the host when it joins
PARAMS = (
    "beam",  # the sentence's beam size (<= K): its width
    "keep",  # hypotheses it returns (n_best)
    "max_len",  # its maximum length in steps
    "alpha",  # GNMT's length penalty
    "beta",  # GNMT's coverage penalty
    "normalize",  # Marian's length normalization
    "word_penalty",  # Marian's word penalty
    "narrowing",  # 1: the beam narrows by the hypotheses ended
    "patience_ends",  # stopping=patience: ceil(beam_size * patience)
    "max_lp",  # lp(max_len) * max_len ** normalize: the exact rule's bound
    "pool",  # the sentence's row of the history buffer
)
RULES = ("exact", "first", "patience", "narrowing")  # then its stopping rule, one-hot (0/1)
MIN_OPSET = 13
# the names the search's inputs and outputs take in the merged graph (besides the decoder's values,
# keys, mask and new_state)
SEARCH_NAMES = (
    "sentences", "join_sentences", "sent_select", "row_base", "history",
    "attention_history", "attention_shape", "out_sentences", "done", "out_history",
    "out_attention_history", "row_select", "blocked", "forced",
)  # fmt: skip


@dataclass(frozen=True)
class SearchShape:
    """What a search graph is built for: K slots a sentence, k candidates a slot, the end of
    sentence, the start token, and the beam rule (narrow_on_eos: only the non-EOS candidates among
    the top `width` continue, the imported toolkits' rule), whether the coverage is kept (only
    while a sentence with a coverage penalty is in the batch: it costs (N, S) work a step), and
    whether the step applies controls (only while a sentence with some is in the batch: they
    touch the step's whole log-softmax row)."""

    K: int
    k: int
    bos_id: int
    eos_id: int
    narrow_on_eos: bool = False
    coverage: bool = False  # a sentence has a coverage penalty: the coverage is kept
    controls: bool = False  # a sentence has controls the graph applies (`device_controls`)

    @property
    def M(self) -> int:
        """Candidates ranked per sentence: 2K, or all of them when fewer."""
        return min(2 * self.K, self.K * self.k)


class Nodes:
    """onnx.helper with generated names: `op` returns its output names."""

    def __init__(self, prefix: str, opset: int) -> None:
        self.prefix = prefix
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0
        self.before = 0  # the nodes that run before the decoder's (`mark_decoder`)

    def mark_decoder(self) -> None:
        """The decoder's nodes go here: the nodes made so far feed it, the next read it."""
        self.before = len(self.nodes)

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def op(self, op_type: str, *inputs: str, out: str = "", **attrs: Any) -> str:
        """One node; returns its (only) output's name (`out` names it)."""
        names = [out or self.name(op_type.lower())]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0]

    def ops(self, op_type: str, *inputs: str, outputs: int, **attrs: Any) -> list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names

    def const(self, value: np.ndarray | Sequence[float] | float, dtype: type = np.float64) -> str:
        array: np.ndarray = np.asarray(value, dtype=dtype)
        name = self.name("const")
        self.inits.append(
            helper.make_tensor(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                array.ravel().tolist(),
            )
        )  # fmt: skip
        return name

    def split(self, x: str, parts: int, axis: int) -> list[str]:
        """x split in `parts` equal parts along `axis` (opset 18 names the count)."""
        if self.opset >= 18:
            return self.ops("Split", x, outputs=parts, axis=axis, num_outputs=parts)
        return self.ops("Split", x, outputs=parts, axis=axis)

    def reduce(self, op_type: str, x: str, axis: int, keepdims: int = 1) -> str:
        """ReduceMax/ReduceMin over one axis (their axes became an input at opset 18)."""
        if self.opset >= 18:
            return self.op(op_type, x, self.const([axis], np.int64), keepdims=keepdims)
        return self.op(op_type, x, axes=[axis], keepdims=keepdims)

    def reduce_sum(self, x: str, axis: int, keepdims: int = 1) -> str:
        return self.op("ReduceSum", x, self.const([axis], np.int64), keepdims=keepdims)

    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", x, to=to)

    def reshape(self, x: str, *shape: int) -> str:
        return self.op("Reshape", x, self.const(list(shape), np.int64))


def sentence_width(K: int) -> int:
    """W: a sentence's rows of `sentences` (W, B): steps, ended, top ended; its n-best's scores,
    log-probs and codes (K each); its slots' tokens, back-pointers, scores and log-probs (K
    each); its settings (PARAMS) and stopping rule (RULES, one-hot)."""
    return SENTENCE_FIELDS + 7 * K + len(PARAMS) + len(RULES)


def topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes in an order where each comes after the nodes whose outputs it reads (the given
    order where it already is); a value no node makes is a graph input or an initializer."""
    made = {o for node in nodes for o in node.output}
    ready: set[str] = set()
    out: list[onnx.NodeProto] = []
    waiting = list(nodes)
    while waiting:
        later = []
        for node in waiting:
            if all(i == "" or i not in made or i in ready for i in node.input):
                out.append(node)
                ready.update(node.output)
            else:
                later.append(node)
        if len(later) == len(waiting):
            raise ValueError(f"the search graph has a cycle through {later[0].op_type}")
        waiting = later
    return out


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


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


def search_step_graph(decoder: onnx.ModelProto, shape: SearchShape) -> onnx.ModelProto:
    """The decoder step with the search's step around it (the module's docstring): a new model;
    `decoder` is not changed. Its inputs: the decoder's state, values, keys, mask, and

    - rows (4, N_prev) f64, sentences (W, B_prev) f64 (and, with coverage, coverage (N_prev,
      S_prev) f32): the previous step's out_rows, out_sentences (out_coverage); the decoder's
      state is its new_state, with the joining sentences' initial states after it;
    - join_rows (4, n·K) f64, join_sentences (W, n) f64: the joining sentences' (n = 0: none);
    - row_select (N,) int64 into rows ++ join_rows, sent_select (B,) int64 into sentences ++
      join_sentences: the batch after its leaves and joins;
    - params (len(PARAMS), B) f64 and rules (4, B) bool: the sentences' settings; row_base (1, B)
      int64: b·K;
    - history (P, L, K, 2) f32 and attention_history (P, L, K, S) f32, bound in place with
      out_history and out_attention_history (a sentence writes its pool row, its step's column);
      attention_shape (3,) int64 (host): B, K, S;
    - with coverage: coverage_ends (1,), coverage_pads (4,) int64 (host): the coverage fitted to
      this step's source axis S.

    Its outputs: out_rows (4, N), out_sentences (W, B), new_state (N, D), done (B,) bool,
    out_history, out_attention_history (and out_coverage (N, S)).

    Per-sentence work is laid out sentence-last ((M, B), (K, B), (1, B)): ONNX Runtime's CPU
    kernels broadcast a (1, B) row over M rows in M vector operations, but a (B, 1) column over
    (B, M) in B of them (measured: 10 µs against 1.3 µs for an add at 1,280 rows)."""
    g = Nodes("search/", opset_of(decoder))
    batch = _select_batch(g, shape)
    g.mark_decoder()  # the decoder step reads search/tokens, search/reorder
    if shape.controls:
        _controls(g, shape)
    cands = _candidates(g, shape, batch)
    beam = _next_beam(g, shape, batch, cands)
    penalty = _coverage_penalties(g, shape, batch, cands, beam) if shape.coverage else None
    nbest = _n_best(g, shape, batch, cands, beam, penalty)
    _stopping(g, batch, beam, nbest)
    _history(g, batch, beam)
    return merge_decoder(decoder, g, shape)


@dataclass(frozen=True)
class _Batch:
    """This step's sentences, sentence-last: fields (1, B) and n-best (K, B) each, their slots'
    scores and log-probs (K, B), settings (1, B) each; the slots' scores (N, 1) row by row."""

    scores: str
    scores_by_row: str
    raw: str
    steps: str
    ended: str
    top_ended: str
    nb_scores: str
    nb_raw: str
    nb_codes: str
    p: dict[str, str]
    coverage: str | None  # (N, S) f32 with coverage


def _select_batch(g: Nodes, shape: SearchShape) -> _Batch:
    """1. The batch after its joins and leaves: the previous sentences and the joining ones,
    picked by sent_select (one column of `sentences` each: its fields, n-best and slots); the
    decoder's tokens and back-pointers, row by row (n = b·K + j)."""
    K, W = shape.K, sentence_width(shape.K)
    picks = g.op(
        "Expand", g.reshape("sent_select", 1, -1), g.const([W, 1], np.int64)
    )  # (W, B): ONNX Runtime's Gather on axis 1 is 4x slower than this GatherElements
    columns = g.op(
        "GatherElements", g.op("Concat", "sentences", "join_sentences", axis=1), picks, axis=1
    )  # (W, B)
    sizes = [1, 1, 1, K, K, K, K, K, K, K, len(PARAMS), len(RULES)]
    fields = g.ops("Split", columns, g.const(sizes, np.int64), outputs=len(sizes), axis=0)
    steps, ended, top_ended, nb_scores, nb_raw, nb_codes = fields[:6]  # (1, B) x 3, (K, B) x 3
    tokens, parents, scores, raw, settings, rules = fields[6:]  # (K, B) x 4, (P, B), (4, B)

    def by_row(x: str) -> str:  # (K, B) → (N,), row n = b·K + j
        return g.reshape(g.op("Transpose", x), -1)

    g.op("Cast", by_row(tokens), to=INT64, out="search/tokens")  # (N,)
    g.op("Cast", by_row(parents), to=INT64, out="search/reorder")  # (N,)
    p = dict(zip(PARAMS, g.split(settings, len(PARAMS), axis=0), strict=True))  # (1, B) each
    p["rules"] = g.op("Greater", rules, g.const(0.0))  # (4, B) bool: the stopping rule, one-hot
    p["columns"] = g.op("Concat", settings, rules, axis=0)  # (P + 4, B): carried to the next step
    coverage = None
    if shape.coverage:  # joining rows start at zero; then fitted to this step's source axis
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
            g.op("Slice", coverage, g.const([0], np.int64), "coverage_ends",
                 g.const([1], np.int64)),
            "coverage_pads",
        )  # fmt: skip  # (N, S)
    return _Batch(
        scores=scores,
        scores_by_row=g.reshape(by_row(scores), -1, 1),
        raw=raw,
        steps=steps,
        ended=ended,
        top_ended=top_ended,
        nb_scores=nb_scores,
        nb_raw=nb_raw,
        nb_codes=nb_codes,
        p=p,
        coverage=coverage,
    )


def _controls(g: Nodes, shape: SearchShape) -> None:
    """2b. The masks and the forced tokens (service/decode/controls.py's, on the device): the
    (row, token) pairs `blocked` (P, 2) set to -inf in the step's log-softmax row before its TopK
    (suppressed tokens, the end of sentence before the minimum length); a row's `forced` (N,)
    token (a prefix's, -1 for none) is its only candidate, at the model's log-prob."""
    k = shape.k
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
    slot: str  # int64, the slot each extends
    token: str  # int64
    step_raw: str  # f32, the model's log-prob of the token
    raw: str  # f64 cumulative model log-prob
    ends: str  # bool: end-of-sentence candidates that finish now
    wanted: str  # bool: candidates that continue


def _candidates(g: Nodes, shape: SearchShape, batch: _Batch) -> _Candidates:
    """3. Each slot's k extensions scored (float64), each sentence's best M; the end-of-sentence
    candidates among its top `width` finish, the best others are wanted (beam.py's _eos_choices and
    _continuations)."""
    K, k, M = shape.K, shape.k, shape.M
    log_probs = g.cast("search/log_probs", DOUBLE)  # (N, k)
    spread = g.op("MatMul", batch.scores_by_row, g.const(np.ones((1, k))))  # (N, k): no broadcast
    candidates = g.op("Add", spread, log_probs)  # (N, k) f64, as numpy adds f64 and f32
    top, index = g.ops(
        "TopK", g.reshape(candidates, -1, K * k), g.const([M], np.int64), outputs=2, axis=1
    )  # (B, M) each, best first, ties by index

    def at(x: str) -> str:  # (N, k) → the candidates' (M, B)
        return g.op("Transpose", g.op("GatherElements", g.reshape(x, -1, K * k), index, axis=1))

    token, step_raw = at("search/token_ids"), at("search/log_probs")  # (M, B)
    top, index = g.op("Transpose", top), g.op("Transpose", index)  # (M, B)
    slot = g.op("Div", index, g.const(k, np.int64))  # (M, B)
    parent_raw = g.op("GatherElements", batch.raw, slot, axis=0)  # (M, B)
    raw = g.op("Add", parent_raw, g.cast(step_raw, DOUBLE))
    rank = g.const(np.arange(M, dtype=np.float64)[:, None])  # (M, 1)
    width = _width(g, batch.p, batch.ended)  # (1, B)
    is_eos = g.op("Equal", token, g.const(shape.eos_id, np.int64))  # (M, B)
    finite = g.op("Greater", top, g.const(-np.inf))
    in_top = g.op("Less", rank, width)
    ends = g.op("And", g.op("And", is_eos, finite), in_top)
    not_eos = g.op("Not", is_eos)
    if shape.narrow_on_eos:  # the non-EOS candidates among the top width
        wanted = g.op("And", g.op("And", not_eos, in_top), finite)
    else:  # the width best non-EOS candidates
        non_eos_rank = g.op("CumSum", g.cast(not_eos, DOUBLE), g.const(0, np.int64))  # 1-based
        wanted = g.op("And", not_eos, g.op("LessOrEqual", non_eos_rank, width))
    return _Candidates(top, slot, token, step_raw, raw, ends, wanted)


def _width(g: Nodes, p: dict[str, str], ended: str) -> str:
    """(1, B) the slots a sentence uses: its beam, narrowed by the hypotheses ended under the
    narrowing rule (beam.py's _Sentence.width): beam - narrowing · min(ended, beam)."""
    return g.op("Sub", p["beam"], g.op("Mul", p["narrowing"], g.op("Min", ended, p["beam"])))


@dataclass(frozen=True)
class _Beam:
    """The next beam: (K, B) each."""

    scores: str  # f64, -inf for dead slots
    raw: str  # f64
    live: str  # bool
    slot: str  # int64 the previous slot each continues
    token: str  # int64
    step_raw: str  # f32
    parents: str = ""  # int64 rows of this step's output each continues


def _next_beam(g: Nodes, shape: SearchShape, batch: _Batch, c: _Candidates) -> _Beam:
    """4. The wanted candidates in slots 0.. in rank order, the others dead; the next step's rows
    (token, back-pointer, score, log-prob) and, with coverage, the coverage they continue."""
    K, M = shape.K, shape.M
    neg_inf = g.const(-np.inf)
    first = g.const(np.arange(2 * M, M, -1, dtype=np.float64)[:, None])  # (M, 1)
    then = g.const(np.arange(M, 0, -1, dtype=np.float64)[:, None])
    key = g.op("Where", c.wanted, first, then)  # (M, B) distinct: wanted first, in rank order
    _, pick = g.ops("TopK", key, g.const([K], np.int64), outputs=2, axis=0)  # (K, B)

    def picked(x: str) -> str:
        return g.op("GatherElements", x, pick, axis=0)

    scores = picked(c.scores)
    live = g.op("And", picked(c.wanted), g.op("Greater", scores, neg_inf))  # (K, B)
    beam = _Beam(
        scores=g.op("Where", live, scores, neg_inf),
        raw=g.op("Where", live, picked(c.raw), neg_inf),
        live=live,
        slot=picked(c.slot),
        token=picked(c.token),
        step_raw=picked(c.step_raw),
    )
    parents = g.op("Add", beam.slot, "row_base")  # (K, B) rows of this step's output
    if batch.coverage is not None:
        step_coverage = g.op("Add", batch.coverage, "search/attention", out="search/coverage")
        order = g.reshape(g.op("Transpose", parents), -1)  # (N,)
        g.op("Gather", step_coverage, order, axis=0, out="out_coverage")  # (N, S)
    return _Beam(beam.scores, beam.raw, beam.live, beam.slot, beam.token, beam.step_raw, parents)


def _coverage_penalties(
    g: Nodes, shape: SearchShape, batch: _Batch, c: _Candidates, beam: _Beam
) -> tuple[str, str]:
    """β · Σ log(clip(coverage, COVERAGE_FLOOR, 1)) over each sentence's own source positions
    (beam.py's coverage_penalty: the sum in float32, then β in float64), of the candidates (M, B)
    and of the next beam's slots (K, B): a row's coverage with this step's attention, its parent's
    for a slot that continues."""
    K = shape.K
    mask = g.op(
        "Reshape",
        g.op("Expand", g.op("Unsqueeze", "mask", g.const([1], np.int64)),
             g.op("Concat", g.const([1, K], np.int64),
                  g.op("Slice", g.op("Shape", "mask"), g.const([1], np.int64),
                       g.const([2], np.int64)), axis=0)),
        g.op("Shape", "search/coverage"),
    )  # fmt: skip  # (N, S) bool: each row's sentence's positions
    clipped = g.op(
        "Clip", "search/coverage", g.const(COVERAGE_FLOOR, np.float32), g.const(1.0, np.float32)
    )
    logs = g.op("Where", mask, g.op("Log", clipped), g.const(0.0, np.float32))  # (N, S)
    sums = g.reduce_sum(logs, 1, keepdims=0)  # (N,) the sum in float32
    per_slot = g.op("Transpose", g.cast(g.reshape(sums, -1, K), DOUBLE))  # (K, B)
    beta = batch.p["beta"]

    def of(slots: str) -> str:
        return g.op("Mul", beta, g.op("GatherElements", per_slot, slots, axis=0))

    return of(c.slot), of(beam.slot)


@dataclass(frozen=True)
class _NBest:
    scores: str  # (K, B) f64 the best `keep` finished, -inf after
    kept: str  # (1, B) f64 how many
    ended: str  # (1, B) f64 hypotheses ended so far
    top_ended: str  # (1, B) f64 1: a step's best-ranked candidate ended
    at_max: str  # (1, B) bool the sentence reached its maximum length


def _n_best(
    g: Nodes,
    shape: SearchShape,
    batch: _Batch,
    c: _Candidates,
    beam: _Beam,
    penalty: tuple[str, str] | None,
) -> _NBest:
    """5. The candidates that finish (end of sentence; at the maximum length, every live slot)
    scored as beam.py's _Sentence.finish does, merged into each sentence's best `keep` (TopK: the
    earlier entries first on ties, as its stable sort)."""
    K = shape.K
    p, neg_inf = batch.p, g.const(-np.inf)
    steps_now = g.op("Add", batch.steps, g.const(1.0))  # (1, B) steps taken, this one included
    lp = g.op(
        "Mul",
        g.op("Pow", g.op("Div", g.op("Add", steps_now, g.const(5.0)), g.const(6.0)), p["alpha"]),
        g.op("Pow", steps_now, p["normalize"]),
    )  # (1, B) GNMT's lp times Marian's length^normalize
    spent = g.op("Mul", p["word_penalty"], steps_now)  # (1, B)
    first, upto_K, axis0 = g.const([0], np.int64), g.const([K], np.int64), g.const([0], np.int64)

    def head(x: str) -> str:  # (M, B) → (K, B): the ends lie in the top width <= K
        return g.op("Slice", x, first, upto_K, axis0)

    def normalized(scores: str, cp: str | None) -> str:
        score = g.op("Div", g.op("Sub", scores, spent), lp)
        return score if cp is None else g.op("Add", score, cp)

    ends = head(c.ends)
    eos_scores = g.op(
        "Where", ends, normalized(head(c.scores), penalty and head(penalty[0])), neg_inf
    )  # (K, B)
    eos_codes = g.op(
        "Add",
        g.cast(head(c.slot), DOUBLE),
        g.op("Add", g.op("Mul", batch.steps, g.const(2.0 * CODE)), g.const(1.0 * CODE)),
    )  # slot + CODE·(2·prefix_steps + 1), prefix_steps = steps
    at_max = g.op("GreaterOrEqual", steps_now, p["max_len"])  # (1, B)
    max_scores = g.op(
        "Where",
        g.op("And", at_max, beam.live),
        normalized(beam.scores, penalty and penalty[1]),
        neg_inf,
    )  # (K, B)
    max_codes = g.op(
        "Add",
        g.const(np.arange(K, dtype=np.float64)[:, None]),
        g.op("Mul", steps_now, g.const(2.0 * CODE)),
    )  # slot + CODE·2·steps
    merged = g.op("Concat", batch.nb_scores, eos_scores, max_scores, axis=0)  # (3K, B)
    best, where = g.ops("TopK", merged, g.const([K], np.int64), outputs=2, axis=0)  # (K, B)
    keep_rank = g.const(np.arange(K, dtype=np.float64)[:, None])
    best = g.op("Where", g.op("Less", keep_rank, p["keep"]), best, neg_inf)
    best_raw = g.op(
        "GatherElements", g.op("Concat", batch.nb_raw, head(c.raw), beam.raw, axis=0), where,
        axis=0,
    )  # fmt: skip
    best_codes = g.op(
        "GatherElements", g.op("Concat", batch.nb_codes, eos_codes, max_codes, axis=0), where,
        axis=0,
    )  # fmt: skip
    kept = g.reduce_sum(g.cast(g.op("Greater", best, neg_inf), DOUBLE), 0)  # (1, B)
    ended_now = g.op("Add", batch.ended, g.reduce_sum(g.cast(ends, DOUBLE), 0))  # (1, B)
    top_eos = g.cast(g.op("Slice", ends, first, g.const([1], np.int64), axis0), DOUBLE)
    top_ended = g.op("Max", batch.top_ended, top_eos)  # (1, B)
    g.op(
        "Concat", steps_now, ended_now, top_ended, best, best_raw, best_codes,
        g.cast(beam.token, DOUBLE), g.cast(beam.parents, DOUBLE), beam.scores, beam.raw,
        p["columns"], axis=0, out="out_sentences",
    )  # fmt: skip  # (W, B)
    return _NBest(best, kept, ended_now, top_ended, at_max)


def _stopping(g: Nodes, batch: _Batch, beam: _Beam, nbest: _NBest) -> None:
    """6. done (B,): dead (no live slot), at the maximum length, or its n-best full and its rule
    met (beam.py's _Sentence.done; `rules` (4, B) one-hot by RULES)."""
    p, neg_inf = batch.p, g.const(-np.inf)
    best_live = g.reduce("ReduceMax", beam.scores, 0)  # (1, B)
    dead = g.op("Equal", best_live, neg_inf)
    full = g.op("GreaterOrEqual", nbest.kept, p["keep"])  # (1, B)
    worst = g.op(
        "GatherElements",
        nbest.scores,
        g.cast(g.op("Max", g.op("Sub", p["keep"], g.const(1.0)), g.const(0.0)), INT64),
        axis=0,
    )  # (1, B) the n-th finished score
    steps_next = g.op("Add", batch.steps, g.const(2.0))  # one more step at least
    bound = g.op(
        "Div", g.op("Sub", best_live, g.op("Mul", p["word_penalty"], steps_next)), p["max_lp"]
    )  # (1, B) the best a live hypothesis can still score
    met = g.op(
        "Concat",
        g.op("LessOrEqual", bound, worst),  # exact
        g.op("Greater", nbest.top_ended, g.const(0.0)),  # first
        g.op("GreaterOrEqual", nbest.ended, p["patience_ends"]),  # patience
        g.op("LessOrEqual", _width(g, p, nbest.ended), g.const(0.0)),  # narrowing
        axis=0,
    )  # (4, B)
    stop = g.reduce("ReduceMax", g.cast(g.op("And", met, p["rules"]), DOUBLE), 0)  # (1, B)
    done = g.op(
        "Or", g.op("Or", dead, nbest.at_max), g.op("And", full, g.op("Greater", stop, g.const(0.0)))
    )
    g.op("Reshape", done, g.const([-1], np.int64), out="done")  # (B,)


def _history(g: Nodes, batch: _Batch, beam: _Beam) -> None:
    """7. Each sentence's column of the history: its slots' codes (token · CODE + back-pointer) and
    their tokens' log-probs (`history` (P, L, 2, K)), this step's attention rows, those of the
    previous beam's slots (`attention_history` (P, L, K, S): its source axis is this step's),
    written in place at its pool row and step."""
    codes = g.cast(g.op("Add", g.op("Mul", beam.token, g.const(CODE, np.int64)), beam.slot), FLOAT)
    columns = g.op("Concat", codes, beam.step_raw, axis=0)  # (2K, B)
    fields = g.op("Reshape", g.op("Transpose", columns), g.const([0, 2, -1], np.int64))  # (B, 2, K)
    index = g.cast(
        g.op("Transpose", g.op("Concat", batch.p["pool"], batch.steps, axis=0)), INT64
    )  # (B, 2): the sentence's pool row, its step
    g.op("ScatterND", "history", index, fields, out="out_history")
    attention = g.op("Reshape", "search/attention", "attention_shape")  # (B, K, S)
    g.op("ScatterND", "attention_history", index, attention, out="out_attention_history")


def merge_decoder(decoder: onnx.ModelProto, g: Nodes, shape: SearchShape) -> onnx.ModelProto:
    """The decoder graph fed by g's nodes: its tokens and reorder inputs renamed to the search's,
    k a constant, its outputs internal but new_state; then g's nodes, inputs, outputs. Values of
    the decoder named like the search's move aside (decoder/...)."""
    model = onnx.ModelProto()
    model.CopyFrom(decoder)
    graph = model.graph
    rename = {
        "tokens": "search/tokens",
        "reorder": "search/reorder",
        "log_probs": "search/log_probs",
        "token_ids": "search/token_ids",
        "attention": "search/attention",
    }
    if shape.controls:  # the TopK reads the masked row; the forced tokens follow it
        topk = scores_topk(graph)
        assert topk is not None, "controls_problem checks it first"
        rename[topk.input[0]] = "search/scores"
        topk.input[0] = "search/masked"
        topk.output[:] = ["search/top_log_probs", "search/top_ids"]
    k_input = next(i for i in graph.input if i.name == "k")
    k_dims = len(k_input.type.tensor_type.shape.dim)
    taken = set(SEARCH_NAMES) | {"out_coverage", "coverage", "coverage_ends", "coverage_pads"}
    internal = {o for node in graph.node for o in node.output} | {i.name for i in graph.initializer}
    rename.update({n: f"decoder/{n}" for n in internal & taken if n not in rename})
    for init in graph.initializer:
        init.name = rename.get(init.name, init.name)
    for node in graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    kept_inputs = [i for i in graph.input if i.name not in ("tokens", "reorder", "k")]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    k_value = np.full((1,) * k_dims, shape.k, np.int64)
    graph.initializer.append(
        helper.make_tensor("k", INT64, k_value.shape, k_value.ravel().tolist())
    )
    new_state = next(o for o in graph.output if o.name == "new_state")
    del graph.output[:]
    nodes = topological([*g.nodes[: g.before], *graph.node, *g.nodes[g.before :]])
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(g.inits)
    vi = helper.make_tensor_value_info
    W = sentence_width(shape.K)
    graph.input.extend(
        [
            vi("sentences", DOUBLE, [W, "B_prev"]),
            vi("join_sentences", DOUBLE, [W, "n"]),
            vi("sent_select", INT64, ["B"]),
            vi("row_base", INT64, [1, "B"]),
            vi("history", FLOAT, ["P", "L", 2, shape.K]),
            vi("attention_history", FLOAT, ["P", "L", shape.K, "S"]),
            vi("attention_shape", INT64, [3]),
        ]
    )
    graph.output.extend(
        [
            vi("out_sentences", DOUBLE, [W, "B"]),
            new_state,
            vi("done", BOOL, ["B"]),
            vi("out_history", FLOAT, ["P", "L", 2, shape.K]),
            vi("out_attention_history", FLOAT, ["P", "L", shape.K, "S"]),
        ]
    )
    if shape.controls:
        graph.input.extend([vi("blocked", INT64, ["P_blocked", 2]), vi("forced", INT64, ["N"])])
    if shape.coverage:
        graph.input.extend(
            [
                vi("coverage", FLOAT, ["N_prev", "S_prev"]),
                vi("row_select", INT64, ["N"]),
                vi("coverage_ends", INT64, [1]),
                vi("coverage_pads", INT64, [4]),
            ]
        )
        graph.output.append(vi("out_coverage", FLOAT, ["N", "S"]))
    onnx.checker.check_model(model)
    return model


def _helper_model(nodes: list, inputs: list, outputs: list, name: str) -> bytes:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def finished_graph() -> bytes:
    """sentences (W, B) f64, history (P, L, K, 2) and attention_history (P, L, K, S) f32, rows
    (D,), pools (D,), steps (1,) int64 → fields (D, W), blocks (D, steps, K, 2) and attention
    (D, steps, K, S): the finished sentences' n-best entries and histories, gathered on the device
    to come down in one copy each."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    nodes = [
        n("Gather", ["sentences", "rows"], ["columns"], axis=1),
        n("Transpose", ["columns"], ["fields"]),
        n("Gather", ["history", "pools"], ["history_rows"], axis=0),
        n("Slice", ["history_rows", "zero", "steps", "one"], ["blocks"]),
        n("Gather", ["attention_history", "pools"], ["attention_rows"], axis=0),
        n("Slice", ["attention_rows", "zero", "steps", "one"], ["attention"]),
    ]
    inputs = [
        vi("sentences", DOUBLE, ["W", "B"]),
        vi("history", FLOAT, ["P", "L", 2, "K"]),
        vi("attention_history", FLOAT, ["P", "L", "K", "S"]),
        vi("rows", INT64, ["D"]),
        vi("pools", INT64, ["D"]),
        vi("steps", INT64, [1]),
        vi("zero", INT64, [1]),
        vi("one", INT64, [1]),
    ]
    outputs = [
        vi("fields", DOUBLE, ["D", "W"]),
        vi("blocks", FLOAT, ["D", "T", 2, "K"]),
        vi("attention", FLOAT, ["D", "T", "K", "S"]),
    ]
    return _helper_model(nodes, inputs, outputs, "finished_sentences")


def grow_graph() -> bytes:
    """history (P, L, K, X) f32, ends (4,), pads (8,) int64 → the history cut to `ends` then
    zero-padded by `pads` (a buffer with more rows or steps, or another source axis, holding the
    old one's entries)."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    nodes = [
        n("Slice", ["history", "starts", "ends"], ["cut"]),
        n("Pad", ["cut", "pads"], ["grown"]),
    ]
    inputs = [
        vi("history", FLOAT, ["P", "L", "K", "X"]),
        vi("starts", INT64, [4]),
        vi("ends", INT64, [4]),
        vi("pads", INT64, [8]),
    ]
    return _helper_model(nodes, inputs, [vi("grown", FLOAT, ["P2", "L2", "K", "X2"])], "grow")
