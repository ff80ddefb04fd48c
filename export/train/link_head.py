"""Training the link head (service/decode/runtime/link_head.py) on gold word links.

The head is trained after the translation model, which stays frozen: its encoder states are read
once per sentence through the bundle's own graph (the served computation), and only the head's
weights learn. The loss per pair, over the (target word, source word) cells:
- cross-entropy of each linked target word's row softmax against its gold links (uniform over them),
- the same per column (each linked source word over the target words),
- binary cross-entropy of every cell against link / no link,
- with `span_loss` > 0, the question markup asks of the links (service/decode/align/projection.py):
  for every source span of 1-3 words and every linked target word, is the share of the word's
  weight on the span above or below one half, against "its links go into the span".

The lexicon features of a training pair must not come from that pair's own links (the head would
learn to trust them more than they deserve on new text), so training pairs are split in two and
each half reads a lexicon counted on the other half; dev and new text read the lexicon of all of
training, which is the one the bundle ships.

With `members` > 1, that many heads are trained with consecutive seeds (their own halves, their own
best epoch), in parallel processes when `workers` > 1, and the exported graph averages their
scores.

With a `[link_head.teacher]` table and `distil` > 0, the teacher it describes (such an ensemble of
bigger heads) is trained first, and the head then learns its scores on the same training pairs
beside the gold links (`distil_loss`): one small head with most of the ensemble's quality, at a
fraction of its cost per pair.
"""

from __future__ import annotations

import logging
import multiprocessing
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from service.decode.runtime.lexicon import NUM_FEATURES, Lexicon
from service.decode.shared.alignment import mean_pool

log = logging.getLogger(__name__)
Link = tuple[int, int]  # (source word, target word)


@dataclass(frozen=True)
class LinkHeadConfig:
    """The `[link_head]` table of a training config."""

    emb_dim: int = 128
    hidden: int = 192
    attn_dim: int = 256
    dropout: float = 0.3
    refine_channels: int = 16
    epochs: int = 8
    batch_size: int = 32
    lr: float = 0.002
    lr_decay: float = 0.7  # per two epochs, from the fourth
    seed: int = 1
    threads: int = 1
    # a wall-clock budget (0: none): no epoch starts that would, at the pace so far, end past it
    # (with several members, the whole head's: each member gets its share)
    max_minutes: float = 0.0
    # the training labels: "links" (every link a positive, every other cell a negative) or, for
    # eflomal's silver links, "agreement": the links both directions agree on are positives, the
    # cells neither proposes negatives, the rest left out of the loss (export/link_head.py)
    labels: str = "links"
    # 2: a second pass, in which each word's GRU reads its first-pass state beside the states of
    # the words the first pass aligns it to, adds a second score (a function word learns where its
    # neighbours went); 1: the first pass alone (heads trained before this option)
    passes: int = 1
    # the weight of the span loss (the module's docstring); 0: none
    span_loss: float = 0.0
    # heads trained with seeds seed, seed + 1, ... (each with its own jackknife halves and its own
    # best dev epoch) whose scores the exported graph averages; `workers` of them train at once,
    # in processes of `threads` threads each
    members: int = 1
    workers: int = 1
    # > 0: the weight of the distillation loss (distil_loss) against the scores of `teacher`, a
    # head ([link_head.teacher]: any of these keys but a teacher of its own) trained first on the
    # same pairs; both or neither
    distil: float = 0.0
    teacher: LinkHeadConfig | None = None

    def __post_init__(self) -> None:
        if self.labels not in ("links", "agreement"):
            raise ValueError(
                f"[link_head] labels must be 'links' or 'agreement', got {self.labels!r}"
            )
        if self.passes not in (1, 2):
            raise ValueError(f"[link_head] passes must be 1 or 2, got {self.passes!r}")
        if self.span_loss < 0:
            raise ValueError(f"[link_head] span_loss must be >= 0, got {self.span_loss!r}")
        if self.members < 1 or self.workers < 1:
            raise ValueError(
                f"[link_head] members and workers must be >= 1, got {self.members}, {self.workers}"
            )
        if self.distil < 0:
            raise ValueError(f"[link_head] distil must be >= 0, got {self.distil!r}")
        if (self.distil > 0) != (self.teacher is not None):
            raise ValueError(
                "[link_head] distil > 0 needs a [link_head.teacher] table, and a teacher needs "
                f"distil > 0 (got distil {self.distil!r}, "
                f"{'a' if self.teacher else 'no'} teacher)"
            )
        if self.teacher is not None and self.teacher.teacher is not None:
            raise ValueError("[link_head.teacher] cannot have a teacher of its own")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LinkHeadConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"[link_head] has unknown keys {unknown} (known: {sorted(known)})")
        if isinstance(raw.get("teacher"), dict):
            raw = {**raw, "teacher": cls.from_dict(raw["teacher"])}
        return cls(**raw)


@dataclass
class Example:
    """One pair as the head reads it (see service/decode/runtime/link_head.py's graph contract)."""

    states: np.ndarray  # (S_w, D) encoder states averaged per source word
    src_ids: np.ndarray  # (P_s,)
    src_word_of: np.ndarray  # (P_s,)
    tgt_ids: np.ndarray  # (P_t,)
    tgt_word_of: np.ndarray  # (P_t,)
    features: np.ndarray  # (T_w, S_w, F)
    gold: list[Link]
    src_words: list[str]
    tgt_words: list[str]
    unlabeled: list[Link] = field(default_factory=list)  # cells left out of the loss
    soft: np.ndarray | None = None  # (T_w, S_w) a teacher's logits, when distilling

    @property
    def shape(self) -> tuple[int, int]:
        return self.features.shape[0], self.features.shape[1]


class LinkHeadNet(nn.Module):
    """Scores (target word, source word) cells: v^T tanh(W_s u_s + W_t u_t + W_f f_ts) + w^T f_ts,
    with u_s a bi-GRU over [tanh(W h_s); pooled source embeddings] and u_t a bi-GRU over pooled
    target embeddings, then refined by a small convolution over the score matrix. With two passes,
    a second bi-GRU on each side reads [u; the u of the other side's words weighted by the first
    scores' softmax], and a second additive score over those states is added."""

    def __init__(self, cfg: LinkHeadConfig, state_dim: int, src_vocab: int, tgt_vocab: int) -> None:
        super().__init__()
        E, H, A = cfg.emb_dim, cfg.hidden, cfg.attn_dim
        self.src_in = nn.Linear(state_dim, H)
        self.src_emb = nn.Embedding(src_vocab, E)
        self.tgt_emb = nn.Embedding(tgt_vocab, E)
        self.src_rnn = nn.GRU(H + E, H, bidirectional=True, batch_first=True)
        self.tgt_rnn = nn.GRU(E, H, bidirectional=True, batch_first=True)
        self.w_src = nn.Linear(2 * H, A)
        self.w_tgt = nn.Linear(2 * H, A, bias=False)
        self.w_cell = nn.Linear(NUM_FEATURES, A, bias=False)
        self.v = nn.Linear(A, 1)
        self.linear_cell = nn.Linear(NUM_FEATURES, 1, bias=False)
        self.drop = nn.Dropout(cfg.dropout)
        # reads each cell's neighbourhood of scores and of both softmaxes: links run in diagonal
        # lines, and a word already claimed in one direction is less likely in the other
        self.refine_in = nn.Conv2d(3, cfg.refine_channels, 5, padding=2)
        self.refine_out = nn.Conv2d(cfg.refine_channels, 1, 5, padding=2)
        self.second = SecondPass(cfg) if cfg.passes == 2 else None

    def forward(
        self,
        source_states: Tensor,  # (B, S_w, D)
        source_ids: Tensor,  # (B, P_s)
        source_pool: Tensor,  # (B, S_w, P_s)
        target_ids: Tensor,  # (B, P_t)
        target_pool: Tensor,  # (B, T_w, P_t)
        cell_features: Tensor,  # (B, T_w, S_w, F)
        src_lengths: Tensor | None = None,  # (B,) words; None: every row full (one pair)
        tgt_lengths: Tensor | None = None,
    ) -> Tensor:
        """→ logits (B, T_w, S_w)."""
        src_emb = source_pool @ self.src_emb(source_ids)  # (B, S_w, E)
        tgt_emb = target_pool @ self.tgt_emb(target_ids)  # (B, T_w, E)
        src_in = torch.cat([torch.tanh(self.src_in(self.drop(source_states))), src_emb], -1)
        u_src = self._run(self.src_rnn, self.drop(src_in), src_lengths)  # (B, S_w, 2H)
        u_tgt = self._run(self.tgt_rnn, self.drop(tgt_emb), tgt_lengths)  # (B, T_w, 2H)
        energy = torch.tanh(
            self.w_src(self.drop(u_src)).unsqueeze(1)  # (B, 1, S_w, A)
            + self.w_tgt(self.drop(u_tgt)).unsqueeze(2)  # (B, T_w, 1, A)
            + self.w_cell(cell_features)  # (B, T_w, S_w, A)
        )
        scores = (self.v(energy) + self.linear_cell(cell_features)).squeeze(-1)  # (B, T_w, S_w)
        scores = scores + self._refinement(scores, src_lengths, tgt_lengths)
        if self.second is None:
            return scores
        by_row, by_col, _ = softmaxes(scores, src_lengths, tgt_lengths)
        u_src2 = self._run(
            self.second.src_rnn,
            self.drop(torch.cat([u_src, by_col.transpose(1, 2) @ u_tgt], -1)),
            src_lengths,
        )  # (B, S_w, 2H)
        u_tgt2 = self._run(
            self.second.tgt_rnn, self.drop(torch.cat([u_tgt, by_row @ u_src], -1)), tgt_lengths
        )  # (B, T_w, 2H)
        energy2 = torch.tanh(
            self.second.w_src(self.drop(u_src2)).unsqueeze(1)
            + self.second.w_tgt(self.drop(u_tgt2)).unsqueeze(2)
            + self.second.w_cell(cell_features)
        )
        return scores + self.second.v(energy2).squeeze(-1)

    def _refinement(
        self, scores: Tensor, src_lengths: Tensor | None, tgt_lengths: Tensor | None
    ) -> Tensor:
        """A correction per cell from the 5x5 neighbourhood of the scores and of their row and
        column softmaxes; outside the sentences every map is 0 (the hidden one too), as the
        convolutions' own zero padding is at a lone pair's borders."""
        by_row, by_col, valid = softmaxes(scores, src_lengths, tgt_lengths)
        if valid is None:
            maps = torch.stack([scores / 5.0, by_row, by_col], 1)  # (B, 3, T_w, S_w)
            return self.refine_out(torch.relu(self.refine_in(maps))).squeeze(1)
        maps = torch.stack([scores.masked_fill(~valid, 0.0) / 5.0, by_row, by_col], 1)
        hidden = torch.relu(self.refine_in(maps)) * valid.unsqueeze(1)  # (B, C, T_w, S_w)
        return self.refine_out(hidden).squeeze(1)

    @staticmethod
    def _run(rnn: nn.GRU, x: Tensor, lengths: Tensor | None) -> Tensor:
        if lengths is None:  # one unpadded pair: the exported graph's case
            return rnn(x)[0]
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = rnn(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


class SecondPass(nn.Module):
    """The second pass's weights (LinkHeadNet's docstring)."""

    def __init__(self, cfg: LinkHeadConfig) -> None:
        super().__init__()
        H, A = cfg.hidden, cfg.attn_dim
        self.src_rnn = nn.GRU(4 * H, H, bidirectional=True, batch_first=True)
        self.tgt_rnn = nn.GRU(4 * H, H, bidirectional=True, batch_first=True)
        self.w_src = nn.Linear(2 * H, A)
        self.w_tgt = nn.Linear(2 * H, A, bias=False)
        self.w_cell = nn.Linear(NUM_FEATURES, A, bias=False)
        self.v = nn.Linear(A, 1)


def softmaxes(
    scores: Tensor, src_lengths: Tensor | None, tgt_lengths: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(each target word's softmax over the source words, each source word's over the target
    words, the cells inside both sentences): 0 outside the sentences; None for `valid` when no
    lengths are given (one unpadded pair, the exported graph's case)."""
    if src_lengths is None or tgt_lengths is None:
        return torch.softmax(scores, -1), torch.softmax(scores, 1), None
    T, S = scores.shape[1:]
    valid = (torch.arange(T)[None, :, None] < tgt_lengths[:, None, None]) & (
        torch.arange(S)[None, None, :] < src_lengths[:, None, None]
    )
    masked = scores.masked_fill(~valid, -1e9)
    by_row = torch.softmax(masked, -1).masked_fill(~valid, 0.0)
    by_col = torch.softmax(masked, 1).masked_fill(~valid, 0.0)
    return by_row, by_col, valid


# --- batches ------------------------------------------------------------------------------------


@dataclass
class Batch:
    inputs: tuple[Tensor, ...]  # the forward's six inputs
    src_lengths: Tensor  # (B,)
    tgt_lengths: Tensor  # (B,)
    gold: Tensor  # (B, T_w, S_w) 1 on gold links
    valid: Tensor  # (B, T_w, S_w) bool, inside both sentences and labelled
    inside: Tensor  # (B, T_w, S_w) bool, inside both sentences
    soft: Tensor | None = None  # (B, T_w, S_w) the teacher's logits, when every example has them


def make_batch(examples: Sequence[Example]) -> Batch:
    B = len(examples)
    S = max(e.shape[1] for e in examples)
    T = max(e.shape[0] for e in examples)
    Ps = max(len(e.src_ids) for e in examples)
    Pt = max(len(e.tgt_ids) for e in examples)
    D = examples[0].states.shape[1]
    states = np.zeros((B, S, D), np.float32)
    src_ids, tgt_ids = np.zeros((B, Ps), np.int64), np.zeros((B, Pt), np.int64)
    src_pool, tgt_pool = np.zeros((B, S, Ps), np.float32), np.zeros((B, T, Pt), np.float32)
    features = np.zeros((B, T, S, NUM_FEATURES), np.float32)
    gold = np.zeros((B, T, S), np.float32)
    unlabeled = np.zeros((B, T, S), bool)
    soft = np.zeros((B, T, S), np.float32)
    for b, e in enumerate(examples):
        t, s = e.shape
        states[b, :s] = e.states
        src_ids[b, : len(e.src_ids)], tgt_ids[b, : len(e.tgt_ids)] = e.src_ids, e.tgt_ids
        src_pool[b, :s, : len(e.src_ids)] = mean_pool(e.src_word_of, s)
        tgt_pool[b, :t, : len(e.tgt_ids)] = mean_pool(e.tgt_word_of, t)
        features[b, :t, :s] = e.features
        for si, ti in e.gold:
            gold[b, ti, si] = 1.0
        for si, ti in e.unlabeled:
            unlabeled[b, ti, si] = True
        if e.soft is not None:
            soft[b, :t, :s] = e.soft
    src_len = torch.tensor([e.shape[1] for e in examples])
    tgt_len = torch.tensor([e.shape[0] for e in examples])
    inside = (torch.arange(T)[None, :, None] < tgt_len[:, None, None]) & (
        torch.arange(S)[None, None, :] < src_len[:, None, None]
    )
    arrays = (states, src_ids, src_pool, tgt_ids, tgt_pool, features)
    return Batch(
        tuple(torch.from_numpy(a) for a in arrays),
        src_len,
        tgt_len,
        torch.from_numpy(gold),
        inside & ~torch.from_numpy(unlabeled),
        inside,
        torch.from_numpy(soft) if all(e.soft is not None for e in examples) else None,
    )


def link_loss(logits: Tensor, gold: Tensor, valid: Tensor, span_weight: float = 0.0) -> Tensor:
    """Row and column cross-entropy against the gold links, plus cell-wise binary cross-entropy,
    plus span_weight times the span loss."""
    cells = nn.functional.binary_cross_entropy_with_logits(logits, gold, reduction="none")
    masked = logits.masked_fill(~valid, -1e9)
    loss = 4.0 * cells[valid].mean()
    for axis, weight in ((-1, 1.0), (1, 0.5)):  # rows: target words; columns: source words
        total = gold.sum(axis, keepdim=True)  # (B, T, 1) or (B, 1, S)
        linked = total.squeeze(axis) > 0
        if bool(linked.any()):
            ce = -(gold / total.clamp(min=1) * torch.log_softmax(masked, axis)).sum(axis)
            loss = loss + weight * ce[linked].mean()
    if span_weight:
        loss = loss + span_weight * span_loss(logits, gold, valid)
    return loss


MAX_SPAN = 3  # the source spans the span loss asks about: 1 to MAX_SPAN words


def span_loss(logits: Tensor, gold: Tensor, valid: Tensor) -> Tensor:
    """Per source span of k = 1..MAX_SPAN words and linked target word: binary cross-entropy of
    the word's projection weight on the span (the share service/decode/align/projection.py compares
    with one half: the two softmaxes' geometric mean, renormalized per target word) against
    "the word has a gold link into the span"; the mean over each k, summed."""
    masked = logits.masked_fill(~valid, -1e9)
    both = torch.sqrt(torch.softmax(masked, -1) * torch.softmax(masked, 1) + 1e-12) * valid
    weights = both / both.sum(-1, keepdim=True).clamp(min=1e-9)  # (B, T, S)
    linked = gold.sum(-1, keepdim=True) > 0  # (B, T, 1)
    S = weights.shape[2]
    loss = logits.new_zeros(())
    for k in range(1, min(MAX_SPAN, S) + 1):
        n = S - k + 1  # spans starting at s = 0..n-1
        mass = torch.stack([weights[..., j : j + n] for j in range(k)]).sum(0)
        mass = mass.clamp(1e-6, 1 - 1e-6)
        inside = (torch.stack([gold[..., j : j + n] for j in range(k)]).sum(0) > 0).float()
        asked = valid[..., k - 1 :] & linked  # the span inside the sentence, the word linked
        if bool(asked.any()):
            bce = -(inside * torch.log(mass) + (1 - inside) * torch.log(1 - mass))
            loss = loss + bce[asked].mean()
    return loss


def distil_loss(logits: Tensor, teacher: Tensor, inside: Tensor) -> Tensor:
    """How far the scores (B, T, S) are from a teacher's in the three readings link_loss trains,
    each a KL divergence of the teacher's distribution from ours (0 where they agree): every
    cell's sigmoid (link / no link), every target word's softmax over the source words and every
    source word's over the target words, unlinked words included (the projection reads their
    rows too); weighted 4, 1 and 0.5 as link_loss weighs them. `inside`: the cells inside both
    sentences."""
    cells = nn.functional.binary_cross_entropy_with_logits(
        logits, torch.sigmoid(teacher), reduction="none"
    ) - nn.functional.binary_cross_entropy_with_logits(
        teacher, torch.sigmoid(teacher), reduction="none"
    )  # (B, T, S) each cell's Bernoulli KL
    loss = 4.0 * cells[inside].mean()
    ours, theirs = logits.masked_fill(~inside, -1e9), teacher.masked_fill(~inside, -1e9)
    for axis, weight in ((-1, 1.0), (1, 0.5)):  # rows: target words; columns: source words
        log_p, log_q = torch.log_softmax(theirs, axis), torch.log_softmax(ours, axis)
        kl = torch.where(inside, log_p.exp() * (log_p - log_q), 0.0).sum(axis)  # (B, T) / (B, S)
        loss = loss + weight * kl[inside.any(axis)].mean()
    return loss


# --- training -----------------------------------------------------------------------------------


def jackknife_features(examples: Sequence[Example], seed: int) -> None:
    """Give each training example the lexicon features of a lexicon counted without it (two
    halves, each featurized by the other's counts)."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    halves = (order[::2], order[1::2])
    for counted, featurized in ((halves[0], halves[1]), (halves[1], halves[0])):
        lexicon = Lexicon.from_links(
            (examples[i].src_words, examples[i].tgt_words, examples[i].gold) for i in counted
        )
        for i in featurized:
            e = examples[i]
            e.features = lexicon.features(e.src_words, e.tgt_words)


@torch.no_grad()
def predict(net: nn.Module, examples: Sequence[Example], batch_size: int = 64) -> list[np.ndarray]:
    """Each example's (T_w, S_w) logits."""
    net.eval()
    out = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        batch = make_batch(chunk)
        logits = net(*batch.inputs, batch.src_lengths, batch.tgt_lengths)
        out += [logits[b, : e.shape[0], : e.shape[1]].numpy() for b, e in enumerate(chunk)]
    return out


Scorer = Callable[[list[np.ndarray], Sequence[Example]], float]
Teacher = Callable[[Sequence[Example]], list[np.ndarray]]  # examples → their (T_w, S_w) logits


def fit(
    cfg: LinkHeadConfig,
    train: list[Example],
    dev: Sequence[Example],
    score: Scorer,
    src_vocab: int,
    tgt_vocab: int,
    teacher: Teacher | None = None,
) -> tuple[LinkHeadNet, list[dict[str, float]]]:
    """Train for cfg.epochs, the training pairs' lexicon features from jackknife halves drawn with
    cfg.seed (and, with cfg.distil, the teacher's logits read over those features); returns the
    net of the epoch with the lowest dev score (AER) and the per-epoch log."""
    jackknife_features(train, cfg.seed)
    if cfg.distil:
        if teacher is None:
            raise ValueError("[link_head] distil > 0 needs a teacher's scores")
        for e, logits in zip(train, teacher(train), strict=True):
            e.soft = logits
    train = list(train)  # shuffled below; the caller's order stays (the next member's halves)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    net = LinkHeadNet(cfg, train[0].states.shape[1], src_vocab, tgt_vocab)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    best: tuple[float, dict[str, Tensor]] | None = None
    history: list[dict[str, float]] = []
    start = time.monotonic()
    for epoch in range(cfg.epochs):
        net.train()
        rng.shuffle(train)
        total = 0.0
        for i in range(0, len(train), cfg.batch_size):
            batch = make_batch(train[i : i + cfg.batch_size])
            logits = net(*batch.inputs, batch.src_lengths, batch.tgt_lengths)
            loss = link_loss(logits, batch.gold, batch.valid, cfg.span_loss)
            if cfg.distil:
                assert batch.soft is not None
                loss = loss + cfg.distil * distil_loss(logits, batch.soft, batch.inside)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            optimizer.step()
            total += float(loss.detach()) * len(batch.src_lengths)
        dev_score = score(predict(net, dev), dev)
        history.append(
            {"epoch": epoch + 1, "loss": total / len(train), "dev_aer": dev_score,
             "minutes": (time.monotonic() - start) / 60}
        )  # fmt: skip
        log.info(
            "link head epoch %d: loss %.3f, dev AER %.4f", epoch + 1, total / len(train), dev_score
        )
        if best is None or dev_score < best[0]:
            best = (dev_score, {k: v.clone() for k, v in net.state_dict().items()})
        if epoch >= 3 and epoch % 2 == 1:
            for group in optimizer.param_groups:
                group["lr"] *= cfg.lr_decay
        minutes = (time.monotonic() - start) / 60
        if cfg.max_minutes and minutes * (epoch + 2) / (epoch + 1) > cfg.max_minutes:
            log.info(
                "link head: stopped after epoch %d (max_minutes %g)", epoch + 1, cfg.max_minutes
            )
            break
    assert best is not None
    net.load_state_dict(best[1])
    net.eval()
    return net, history


class LinkHeadEnsemble(nn.Module):
    """Members' scores averaged: one graph, the same contract as one head."""

    def __init__(self, members: Sequence[LinkHeadNet]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(
        self,
        source_states: Tensor,
        source_ids: Tensor,
        source_pool: Tensor,
        target_ids: Tensor,
        target_pool: Tensor,
        cell_features: Tensor,
        src_lengths: Tensor | None = None,
        tgt_lengths: Tensor | None = None,
    ) -> Tensor:
        inputs = (source_states, source_ids, source_pool, target_ids, target_pool, cell_features)
        scores = [m(*inputs, src_lengths, tgt_lengths) for m in self.members]
        return torch.stack(scores).mean(0)


def fit_members(
    cfg: LinkHeadConfig,
    train: list[Example],
    dev: Sequence[Example],
    score: Scorer,
    src_vocab: int,
    tgt_vocab: int,
    teacher: Teacher | None = None,
) -> tuple[LinkHeadNet | LinkHeadEnsemble, list[list[dict[str, float]]]]:
    """cfg.members heads (seeds cfg.seed, cfg.seed + 1, ...), cfg.workers at a time in their own
    processes; one head is returned as it is, several as their ensemble. Each member's log.
    `teacher`: the scores each member distils, with cfg.distil (picklable with workers > 1)."""
    rounds = -(-cfg.members // min(cfg.workers, cfg.members))  # members one worker trains
    budget = cfg.max_minutes / rounds  # max_minutes is the whole head's, split among the rounds
    configs = [replace(cfg, seed=cfg.seed + i, max_minutes=budget) for i in range(cfg.members)]
    if cfg.workers == 1 or cfg.members == 1:
        done = [fit(c, train, dev, score, src_vocab, tgt_vocab, teacher) for c in configs]
    else:
        context = multiprocessing.get_context("spawn")  # no fork of a process torch has threaded
        with ProcessPoolExecutor(min(cfg.workers, cfg.members), mp_context=context) as pool:
            jobs = [
                pool.submit(fit, c, train, dev, score, src_vocab, tgt_vocab, teacher)
                for c in configs
            ]
            done = [job.result() for job in jobs]
    nets = [net for net, _ in done]
    head = nets[0] if len(nets) == 1 else LinkHeadEnsemble(nets).eval()
    return head, [history for _, history in done]
