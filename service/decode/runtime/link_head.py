"""The link head: a small supervised aligner shipped in a bundle beside the translation graphs.

Attention is trained to predict the next target token, and at step t it has not yet seen the token
it is aligned to; guided alignment pulls it onto gold links on the training sentences, but on new
sentences it stays a guess about the next word (on the Greek model: AER 0.115 on training verses,
0.47 on dev). The link head instead reads the whole pair: the translation encoder's states pooled per
source word and its own embeddings of the source pieces, a bidirectional GRU over the target words
(which it sees, the word to align included), and per (target word, source word) cell a few features
(relative positions, and how often the training corpus's gold links pair the two words:
service/decode/runtime/lexicon.py). It scores every cell; a row's softmax is the target word's distribution
over the source words, and each logit is also trained as an independent link / no-link score. Links:
each target word's best source word where its sigmoid(logit) reaches the row threshold (0: every
target word gets one), plus every cell whose sigmoid(logit) reaches the cell threshold (how a target
word gets a second source word); export/link_head.py picks both thresholds with the lowest AER on the
dev split and records them in the manifest.

Graph contract (`link_head.onnx`, written by export/onnx/link_head.py), one pair per call:
  source_states  (1, S_w, D)  float  the encoder's `values` averaged over each source word's pieces
  source_ids     (1, P_s)     int64  the source pieces
  source_pool    (1, S_w, P_s) float row w: 1/n over word w's n pieces
  target_ids     (1, P_t)     int64
  target_pool    (1, T_w, P_t) float
  cell_features  (1, T_w, S_w, F) float  Lexicon.features
→ link_logits    (1, T_w, S_w) float
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.decode.runtime.lexicon import NUM_FEATURES, Lexicon
from service.decode.shared.alignment import mean_pool
from service.model.bundle import Bundle, BundleError

if TYPE_CHECKING:  # a front's text side holds a link head without its graph: no ONNX Runtime
    import onnxruntime as ort

GRAPH = "link_head.onnx"
LEXICON = "link_lexicon.json"
INPUTS = (
    "source_states",
    "source_ids",
    "source_pool",
    "target_ids",
    "target_pool",
    "cell_features",
)
OUTPUT = "link_logits"


class LinkHeadError(ValueError):
    """The link head's files do not make a link head."""


Link = tuple[int, int]  # (source word, target word)
Thresholds = tuple[float, float]  # (row, cell)


def logit(p: float) -> float:
    """The logit a sigmoid maps to p; -inf at 0, inf at 1."""
    if p <= 0:
        return -np.inf
    return np.inf if p >= 1 else float(np.log(p / (1 - p)))


def head_links(logits: np.ndarray, row_threshold: float, cell_threshold: float) -> set[Link]:
    """(T_w, S_w) logits → each row's argmax where sigmoid >= row_threshold, plus every cell with
    sigmoid >= cell_threshold."""
    T, S = logits.shape
    if T == 0 or S == 0:
        return set()
    best = logits.argmax(axis=1)  # (T,)
    keep = logits[np.arange(T), best] >= logit(row_threshold)  # (T,)
    links = {(int(best[t]), t) for t in np.flatnonzero(keep).tolist()}
    rows, cols = np.nonzero(logits >= logit(cell_threshold))
    return links | {(int(s), int(t)) for t, s in zip(rows.tolist(), cols.tolist(), strict=True)}


def head_inputs(
    word_states: np.ndarray,
    src_ids: Sequence[int] | np.ndarray,
    src_word_of: np.ndarray,
    tgt_ids: Sequence[int] | np.ndarray,
    tgt_word_of: np.ndarray,
    features: np.ndarray,
) -> dict[str, np.ndarray]:
    """One pair's graph inputs (batch of 1): word_states (S_w, D) the encoder's values averaged
    per source word (`mean_pool(src_word_of, S_w) @ values`), features (T_w, S_w, F)."""
    T_w, S_w = features.shape[:2]
    return {
        "source_states": word_states[None].astype(np.float32, copy=False),  # (1, S_w, D)
        "source_ids": np.asarray(src_ids, np.int64)[None],
        "source_pool": mean_pool(src_word_of, S_w)[None],
        "target_ids": np.asarray(tgt_ids, np.int64)[None],
        "target_pool": mean_pool(tgt_word_of, T_w)[None],
        "cell_features": features[None].astype(np.float32, copy=False),
    }


class LinkHead:
    """A bundle's link head on the CPU: word-level link probabilities for one pair at a time.
    Without its graph (`session` None: a front process's text side) it reads links from scores
    computed elsewhere (`links`) and computes none."""

    def __init__(
        self,
        session: ort.InferenceSession | None,
        lexicon: Lexicon | None,
        thresholds: Thresholds,
        where: Path,
    ) -> None:
        self.session = session
        self.lexicon = lexicon
        self.thresholds = thresholds
        if session is None:
            return
        names = {i.name for i in session.get_inputs()}
        if names != set(INPUTS) or OUTPUT not in {o.name for o in session.get_outputs()}:
            raise LinkHeadError(
                f"{where / GRAPH} is not a link head graph: inputs {sorted(names)}, expected "
                f"{sorted(INPUTS)} and an output {OUTPUT!r}"
            )
        features = next(i for i in session.get_inputs() if i.name == "cell_features").shape[-1]
        if isinstance(features, int) and features != NUM_FEATURES:
            raise LinkHeadError(
                f"{where / GRAPH} reads {features} cell features; this server computes "
                f"{NUM_FEATURES} (re-train the link head)"
            )

    @classmethod
    def load(cls, directory: Path, thresholds: Thresholds) -> LinkHead:
        """One thread, no spinning: a call is a millisecond of small matrices, one pair at a time
        (more threads only wait for each other, and spin against the decoder's)."""
        import onnxruntime as ort  # an engine's alone: a front's text side never loads the graph

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(
                str(directory / GRAPH), sess_options=options, providers=["CPUExecutionProvider"]
            )
            lexicon = Lexicon.load(directory / LEXICON)
        except Exception as err:
            raise LinkHeadError(f"{directory}: cannot load the link head: {err}") from err
        return cls(session, lexicon, thresholds, directory)

    def logits(
        self,
        states: np.ndarray,
        src_words: Sequence[str],
        src_ids: Sequence[int],
        src_word_of: np.ndarray,
        tgt_words: Sequence[str],
        tgt_ids: Sequence[int],
        tgt_word_of: np.ndarray,
    ) -> np.ndarray:
        """(T_w, S_w) float32 scores of every (target word, source word) cell."""
        if self.session is None or self.lexicon is None:
            raise RuntimeError("this link head has no graph: its scores are computed elsewhere")
        features = self.lexicon.features(src_words, tgt_words)  # (T_w, S_w, F)
        word_states = mean_pool(src_word_of, len(src_words)) @ states  # (S_w, D)
        inputs = head_inputs(word_states, src_ids, src_word_of, tgt_ids, tgt_word_of, features)
        (logits,) = self.session.run([OUTPUT], inputs)  # (1, T_w, S_w)
        return np.asarray(logits[0], np.float32)

    def links(self, logits: np.ndarray) -> set[Link]:
        return head_links(logits, *self.thresholds)


def load_link_head(bundle: Bundle, graph: bool = True) -> LinkHead | None:
    """The bundle's link head, None when it has none; BundleError when its files are not one.
    graph False: its thresholds alone (no session, no lexicon)."""
    if not bundle.has_link_head or bundle.link_head_thresholds is None:
        return None
    if not graph:
        return LinkHead(None, None, bundle.link_head_thresholds, bundle.path)
    try:
        return LinkHead.load(bundle.path, bundle.link_head_thresholds)
    except LinkHeadError as err:
        raise BundleError(str(err)) from err
