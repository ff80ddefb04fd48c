"""A Transformer's self-attention caches kept in place on the CPU, a slot a hypothesis: rows
that join and leave a running batch copy nothing, a beam's reorder copies only the hypotheses that
fork (a parent's second child and after), and each row attends over its own entries, not the
longest row's.

The graph contract's decoder step reads each layer's cache (R, heads, L, d / heads) left-padded to
the batch's longest row, gathers it by the back-pointers and writes it anew one entry longer
(service/model/graph_contract.py). Offline, where a batch's sentences start together and end
about together, that costs little; served, with sentences joining and leaving at every step, the
cache is as long as the oldest row's (a sentence run to its length cap pads every other row to
its length) and each step copied every cache twice, in the Gather and in the attention's concat:
on grc-en-nt-transformer at 64 clients the self-attentions and those Gathers took 53% of the
step's kernels, against 30% in a batch of the same size offline (ONNX Runtime's profiler).

`attend_in_place` rewrites the step's graph at load, where each self-attention is ONNX Runtime's
fused `MultiHeadAttention` reading `Gather(cache, reorder)`: it becomes `GroupQueryAttention`
(com.microsoft) over the cache input itself, in slot order. The caches are buffers of slots
(capacity, heads, entries capacity, d / heads), each slot a hypothesis's entries from its first;
the step gathers its rows' queries, keys and values into their slots (`cache_rows`), the kernel
attends over each slot's own `cache_lengths` entries and, bound with its `present` outputs in the
same memory as its `past` inputs, writes each new entry at its slot's length, in place; the
outputs go back to row order (`cache_slots`). Those gathers move one token's vectors a row.

Between steps the host (`CachesInPlace`, standing for service/decode/runtime/runtime.py's
DeclaredStates) gives each row a slot: a row takes its parent's slot where it is the parent's
first child, a free one otherwise, into which the parent's entries are copied (numpy, in the
provider's memory, which on the CPU is the host's); a slot no row takes is free. Measured under
churn at 64 sentences, beam 5: 72% of the rows had another row as parent, 30% were forks. Other
devices keep the contract's graph.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from service.decode.runtime.device import Device
from service.decode.runtime.graph_nodes import topological
from service.model.architecture import StateSpec

MHA = "MultiHeadAttention"
GQA = "GroupQueryAttention"
MS = "com.microsoft"
POSITIONS = "positions"  # each row's entries before this step (the host search's input)
# the step's slot inputs: each slot's row (C,), each row's slot (N,), each slot's entries before
# the step (C,) int32 and their most + 1 () int32, as GroupQueryAttention reads them
ROWS, SLOTS, LENGTHS, TOTAL = "cache_rows", "cache_slots", "cache_lengths", "cache_total"
SLOT_INPUTS = (ROWS, SLOTS, LENGTHS, TOTAL)
ENTRY_STEP = 32  # a cache's entries capacity grows and shrinks in steps of this many
COPY_STEP = 8  # rows moved by a reorder are copied in groups whose lengths round up to this
FEW_FORKS = 8  # up to this many rows moved are copied one by one


def cacheable(specs: Sequence[StateSpec]) -> bool:
    """Whether these declared states are all caches in the fused layout (R, heads, L, d)."""
    return bool(specs) and all(s.growing and s.heads for s in specs)


def attend_in_place(model: onnx.ModelProto, specs: Sequence[StateSpec]) -> bool:
    """Rewrite, in place, each self-attention that reads its layer's caches through
    Gather(cache, reorder) into GroupQueryAttention over the caches themselves; True where every
    cache of `specs` was so read (the graph is then rewritten), False (unchanged) otherwise."""
    if not cacheable(specs):
        return False
    graph = model.graph
    caches = {s.name for s in specs}
    producers = {out: node for node in graph.node for out in node.output}
    plans: list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]] = []
    for node in graph.node:
        gathers = _cache_gathers(node, producers, caches)
        if gathers is not None:
            plans.append((node, *gathers))
    read = {g.input[0] for _, gk, gv in plans for g in (gk, gv)}
    if read != caches or len(plans) * 2 != len(caches):
        return False
    for mha, gather_k, gather_v in plans:
        heads, name = _attribute(mha, "num_heads"), mha.name or mha.output[0]
        slotted = [f"{name}/slot_{part}" for part in ("q", "k", "v", "out")]
        nodes = [
            helper.make_node("Gather", [mha.input[i], ROWS], [slotted[i]], axis=0) for i in range(3)
        ]  # (C, 1, d): the slots' queries, keys, values
        gqa = helper.make_node(
            GQA,
            [*slotted[:3], gather_k.input[0], gather_v.input[0], LENGTHS, TOTAL],
            [slotted[3], *mha.output[1:3]],
            name=f"{name}/in_place",
            domain=MS,
            num_heads=heads,
            kv_num_heads=heads,
        )
        scale = next((a for a in mha.attribute if a.name == "scale"), None)
        if scale is not None:
            gqa.attribute.append(scale)
        back = helper.make_node("Gather", [slotted[3], SLOTS], [mha.output[0]], axis=0)
        at = list(graph.node).index(mha)
        graph.node.remove(mha)
        for offset, node in enumerate([*nodes, gqa, back]):
            graph.node.insert(at + offset, node)
        graph.node.remove(gather_k)
        graph.node.remove(gather_v)
    graph.input.extend(
        [
            helper.make_tensor_value_info(ROWS, TensorProto.INT64, ["cache_slots_capacity"]),
            helper.make_tensor_value_info(SLOTS, TensorProto.INT64, ["hyps"]),
            helper.make_tensor_value_info(LENGTHS, TensorProto.INT32, ["cache_slots_capacity"]),
            helper.make_tensor_value_info(TOTAL, TensorProto.INT32, []),
        ]
    )
    _drop_dead_nodes(graph)
    ordered = topological(list(graph.node))  # the lengths' nodes were appended last
    del graph.node[:]
    graph.node.extend(ordered)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return True


def _cache_gathers(
    node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], caches: set[str]
) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """The Gathers of a self-attention's past key and value, where `node` is the fused attention
    over (query, key, value) with no bias, reading Gather(cache, reorder) as its past and writing
    `new_<cache>` as its present; None for any other node."""
    if node.op_type != MHA or node.domain != MS or len(node.input) != 8 or node.input[3]:
        return None
    gathers = [producers.get(node.input[i]) for i in (6, 7)]
    for gather, out in zip(gathers, node.output[1:3], strict=True):
        if gather is None or gather.op_type != "Gather" or _attribute(gather, "axis"):
            return None
        if gather.input[0] not in caches or gather.input[1] != "reorder":
            return None
        if out != f"new_{gather.input[0]}":
            return None
    assert gathers[0] is not None and gathers[1] is not None
    return gathers[0], gathers[1]


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes nothing reads any more (the self-attentions' masks from `positions`, and
    the shapes of the gathered caches they were made from), and the initializers they read."""
    producers = {out: node for node in graph.node for out in node.output}
    live_nodes: dict[int, onnx.NodeProto] = {}
    wanted = [o.name for o in graph.output]
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producers.get(name)
        if node is not None and id(node) not in live_nodes:
            live_nodes[id(node)] = node
            wanted.extend(node.input)
    kept = [node for node in graph.node if id(node) in live_nodes]
    del graph.node[:]
    graph.node.extend(kept)
    unread = [i for i in graph.initializer if i.name not in seen]
    for init in unread:
        graph.initializer.remove(init)


def _attribute(node: onnx.NodeProto, name: str) -> int:
    found = next((a for a in node.attribute if a.name == name), None)
    return int(helper.get_attribute_value(found)) if found is not None else 0


PARALLEL_COPY = 2048  # entries x caches to copy above which a second thread takes half


@functools.cache
def _copier() -> ThreadPoolExecutor:
    """The thread that copies half of a step's cache entries beside the decode loop's own."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-copy")


def entries_capacity(needed: int) -> int:
    """The entries a cache buffer holds for `needed` (rounded up to ENTRY_STEP, with room for
    the next ENTRY_STEP steps)."""
    return (needed // ENTRY_STEP + 2) * ENTRY_STEP


def rows_capacity(needed: int) -> int:
    return max(16, needed + needed // 4)


class CachesInPlace:
    """A running batch's self-attention caches for a step graph made by `attend_in_place`: one
    buffer a cache, (slots, heads, entries capacity, d / heads), in the host's memory (the CPU
    provider's); each row of the step has a slot, whose first `positions` entries are its own.

    The same calls as DeclaredStates (service/decode/runtime/runtime.py), which it stands for where the
    model's graphs attend in place, plus `arrange`, before each step (the module docstring)."""

    def __init__(self, specs: Sequence[StateSpec], device: Device) -> None:
        self.specs = tuple(specs)
        self.device = device
        self.growing = True
        self.lazy_join = False
        self.positions = np.zeros(0, np.int64)  # (R,) each row's entries
        self.slot_of_row = np.zeros(0, np.int64)  # (R,) each row's slot; -1: a joining row's
        self.buffers: dict[str, np.ndarray] = {}  # by name: (C, heads, E, d / heads)
        self.values: dict[str, ort.OrtValue] = {}  # the buffers as OrtValues (same memory)
        self.inputs: dict[str, np.ndarray] = {}  # this step's ROWS, SLOTS, LENGTHS, TOTAL
        self.used = 0  # the slots the step reads: up to the last one a row holds

    @property
    def rows(self) -> int:
        return len(self.slot_of_row)

    @property
    def capacity(self) -> tuple[int, int]:
        """(slots, entries) the buffers hold."""
        shape = next(iter(self.buffers.values())).shape if self.buffers else (0, 0, 0, 0)
        return shape[0], shape[2]

    def join(self, n: int) -> None:
        """n joining sentences' rows, after the others: no entries, no slot yet."""
        self.positions = np.concatenate([self.positions, np.zeros(n, np.int64)])
        self.slot_of_row = np.concatenate([self.slot_of_row, np.full(n, -1, np.int64)])

    def cache_reorder(self, reorder: np.ndarray) -> np.ndarray:
        """The graph reads no back-pointer for the caches (`arrange` applied them)."""
        return reorder

    def arrange(self, reorder: np.ndarray, lengths: np.ndarray) -> None:
        """The step's rows (N,) from the last step's rows `reorder` (N,), each holding lengths[i]
        entries (its parent's; 0 for a joining sentence's row): a parent's first child takes its
        slot, every other row a free slot, with its parent's entries copied into it."""
        N = len(reorder)
        parents = np.where(lengths > 0, self.slot_of_row[reorder], -1)  # (N,) slots, -1: none
        if self._fit(N, int(lengths.max(initial=0)) + 1, parents):  # slots renumbered
            parents = np.where(lengths > 0, self.slot_of_row[reorder], -1)
        rows = np.arange(N)
        has = np.flatnonzero(parents >= 0)[::-1]  # rows with a parent, last first
        keeper = np.full(self.capacity[0], -1, np.int64)  # (C,) the row that keeps each slot
        keeper[parents[has]] = has  # written last first: each slot's first child keeps it
        keeps = (parents >= 0) & (keeper[np.maximum(parents, 0)] == rows)
        slots = np.where(keeps, parents, -1)  # (N,)
        fresh = np.flatnonzero(~keeps)  # forks and joining rows
        if len(fresh):
            slots[fresh] = np.flatnonzero(keeper < 0)[: len(fresh)]
            forks = fresh[parents[fresh] >= 0]
            if len(forks):
                self._copy(parents[forks], slots[forks], lengths[forks])
        if int(slots.max(initial=-1)) >= N + max(8, N // 8):  # scattered: the step pays for holes
            slots = self._pack(slots, lengths)
        self.slot_of_row = slots
        self._inputs(slots, lengths)

    def _pack(self, slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The rows' slots packed into the first N (a row's in a slot at N or past it moved to a
        free one below N, its entries copied): the kernel attends over every slot up to the last
        used one, and a free slot still costs it (the longest row's length)."""
        N = len(slots)
        high = np.flatnonzero(slots >= N)  # (H,) rows to move
        used = np.zeros(N, bool)
        used[slots[slots < N]] = True
        free = np.flatnonzero(~used)[: len(high)]  # as many free slots below N as rows above
        self._copy(slots[high], free, lengths[high])
        packed = slots.copy()
        packed[high] = free
        return packed

    def _copy(self, sources: np.ndarray, targets: np.ndarray, lengths: np.ndarray) -> None:
        """Slots `sources`' first `lengths` entries into slots `targets` (free ones: no slot is
        both): a few one by one (plain slices, no gathered temporaries), more by groups of about
        the same length, each at its own."""
        buffers = list(self.buffers.values())
        if len(sources) <= FEW_FORKS:  # a handful of rows: a beam or two
            moves = list(zip(sources.tolist(), targets.tolist(), lengths.tolist(), strict=True))
            for buffer in buffers:
                for src, dst, entries in moves:
                    buffer[dst, :, :entries] = buffer[src, :, :entries]
            return
        groups = (lengths + COPY_STEP - 1) // COPY_STEP  # (M,)
        plan = []
        for group in np.unique(groups).tolist():
            at = groups == group
            plan.append((sources[at], targets[at], group * COPY_STEP))

        def copy(buffers: list[np.ndarray]) -> None:
            for buffer in buffers:
                for src, dst, entries in plan:
                    buffer[dst, :, :entries] = buffer[src, :, :entries]

        halves = [buffers[0::2], buffers[1::2]]
        if int(lengths.sum()) * len(buffers) < PARALLEL_COPY:  # not worth a second thread
            copy(buffers)
            return
        # numpy lets go of the interpreter's lock while it copies: the other core takes half
        done = _copier().submit(copy, halves[1])
        copy(halves[0])
        done.result()

    def _inputs(self, slots: np.ndarray, lengths: np.ndarray) -> None:
        """The step's slot inputs: each slot's row (a free slot computes row 0's, unread) and
        entries (a free slot's 0), each row's slot, and the most entries + 1."""
        self.used = int(slots.max(initial=-1)) + 1  # the step reads slots 0..used-1
        rows = np.zeros(self.used, np.int64)
        rows[slots] = np.arange(len(slots))
        entries = np.zeros(self.used, np.int32)
        entries[slots] = lengths
        total = np.array(int(lengths.max(initial=0)) + 1, np.int32)
        self.inputs = {ROWS: rows, SLOTS: slots, LENGTHS: entries, TOTAL: total}

    def _fit(self, rows: int, entries: int, parents: np.ndarray) -> bool:
        """Buffers of at least `rows` slots and `entries` entries, the parents' entries kept; a
        buffer four times longer or wider than needed is cut (its memory given back). True where
        new buffers were made: the slots are then renumbered in the parents' order."""
        have_slots, have_entries = self.capacity
        long = have_entries > 4 * entries and have_entries > 2 * ENTRY_STEP
        wide = have_slots > 4 * rows and have_slots > 64
        if rows <= have_slots and entries <= have_entries and not (long or wide):
            return False
        slots = rows_capacity(rows) if rows > have_slots or wide else have_slots
        shape_entries = entries_capacity(entries)
        live = np.unique(parents[parents >= 0])  # the slots whose entries a row reads
        keep = min(have_entries, shape_entries)
        renumber = np.full(max(have_slots, 1), -1, np.int64)
        renumber[live] = np.arange(len(live))
        for spec in self.specs:
            heads, width = spec.heads, spec.width // spec.heads
            new = np.zeros((slots, heads, shape_entries, width), np.float32)
            old = self.buffers.get(spec.name)
            if old is not None and len(live):
                new[: len(live), :, :keep] = old[live, :, :keep]
            self.buffers[spec.name] = new
            self.values[spec.name] = ort.OrtValue.ortvalue_from_numpy(new)
        known = self.slot_of_row >= 0
        self.slot_of_row[known] = renumber[self.slot_of_row[known]]
        return True

    def shape(self, spec: StateSpec) -> tuple[int, ...]:
        """A cache as the step reads and writes it: its slots up to the last used one."""
        return (self.used, *self.buffers[spec.name].shape[1:])

    def bind(self, binding: ort.IOBinding, positions: np.ndarray | None = None) -> None:
        """The caches and this step's slot inputs as the step's inputs, and its positions (N,)
        where given (the device search's step computes them)."""
        device = self.device
        for spec in self.specs:
            device.bind_device_input(binding, spec.name, self.values[spec.name], self.shape(spec))
        for name, array in self.inputs.items():
            device.bind_host_input(binding, name, array, "tokens")
        if positions is not None:
            device.bind_host_input(binding, POSITIONS, positions, "tokens")

    def bind_outputs(self, binding: ort.IOBinding) -> None:
        """The step's `new_<name>` outputs in the inputs' memory: it writes the caches in place."""
        for spec in self.specs:
            value, shape = self.values[spec.name], self.shape(spec)
            self.device.bind_device_output(binding, "new_" + spec.name, value, shape)

    def stepped(self, outputs: Sequence[ort.OrtValue], positions: np.ndarray) -> None:
        """After a step: each row holds one entry more (written in place)."""
        self.positions = positions + 1

    def cut(self, needed: int) -> None:
        """Nothing to cut: `arrange` fits the buffers to what the rows hold."""

    def reset(self) -> None:
        self.positions = np.zeros(0, np.int64)
        self.slot_of_row = np.zeros(0, np.int64)
        self.buffers, self.values, self.inputs, self.used = {}, {}, {}, 0
