"""marian-decoder's beam search (1.12, src/translator/beam_search.cpp, history.h) over a bundle's
graphs: the reference that shows an imported Marian model gives Marian's n-best exactly, apart
from serving (which has the same rules as options: stopping "narrowing", normalize, word_penalty,
max_length_factor; a Marian bundle's decoding defaults; docs/import.md, "Marian's decoding rules").

Where it differs from service/decode/search/beam.py's default rule for imported models:
- the beam narrows for good: with f hypotheses finished, a sentence keeps the top K - f candidates
  (EOS ones among them finish, the others go on), and its search ends when K have finished;
- the maximum length is ceil(max_length_factor x the source's tokens with `</s>`) target tokens, at
  which every hypothesis of that step, finished or not, joins the n-best list (marian-decoder
  counts the widest source of its mini-batch: decode one sentence a batch to compare);
- the n-best list ranks (log P - word_penalty x length) / length^normalize, length with `</s>`.

One sentence at a time, plain onnxruntime: a reference, not a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.model.architecture import BOS_ID, EOS_ID
from service.model.bundle import load_bundle
from service.model.vocab import TextTokenizer, load_tokenizers


@dataclass(frozen=True)
class MarianRules:
    beam_size: int = 5
    normalize: float = 0.0  # --normalize
    word_penalty: float = 0.0  # --word-penalty
    max_length_factor: float = 3.0  # --max-length-factor


@dataclass(frozen=True)
class Scored:
    text: str
    score: float  # normalized as the n-best list ranks it
    log_prob: float
    tokens: tuple[int, ...]
    attention: np.ndarray  # (T, S) the attention behind each token, `</s>` included


@dataclass
class _Hyp:
    tokens: list[int]
    score: float
    row: int  # its state's row in the last step's output
    attention: list[np.ndarray]


class MarianSearch:
    """A bundle's encoder and decoder-step graphs under marian-decoder's search rules."""

    def __init__(self, bundle_dir: Path, threads: int = 1, int8: bool = False) -> None:
        bundle = load_bundle(bundle_dir)
        self.src_tok: TextTokenizer
        self.tgt_tok: TextTokenizer
        self.src_tok, self.tgt_tok = load_tokenizers(bundle)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        decoder = "decoder.int8.onnx" if int8 else "decoder.onnx"
        self.encoder = ort.InferenceSession(str(bundle_dir / "encoder.onnx"), options)
        self.decoder = ort.InferenceSession(str(bundle_dir / decoder), options)

    def translate(self, text: str, rules: MarianRules) -> list[Scored]:
        """The n-best list (at most beam_size, best first) of one source text."""
        ids = self.src_tok.encode(text)  # with `</s>`
        src = np.array([ids], np.int64)  # (1, S)
        values, keys, mask, state = self.encoder.run(
            None, {"src": src, "src_lengths": np.array([len(ids)], np.int64)}
        )
        K = rules.beam_size
        max_len = math.ceil(rules.max_length_factor * len(ids))
        beam = [_Hyp(tokens=[], score=0.0, row=0, attention=[])]
        width = K  # marian's first beam: K copies of the start, expanded once
        final: list[Scored] = []
        for t in range(max_len):
            feed = {
                "tokens": np.array([h.tokens[-1] if h.tokens else BOS_ID for h in beam], np.int64),
                "state": state,
                "reorder": np.array([h.row for h in beam], np.int64),
                "values": values,
                "keys": keys,
                "mask": mask,
                "k": np.array(K, np.int64),
            }
            log_probs, token_ids, state, attention = self.decoder.run(None, feed)  # (N, K) ...
            # every hypothesis's K best words, ranked by path score; Marian keeps the top `width`
            scores = np.array([h.score for h in beam])[:, None] + log_probs.astype(np.float64)
            order = np.argsort(-scores, axis=None, kind="stable")[:width]
            chosen = [divmod(int(i), K) for i in order if np.isfinite(scores.flat[int(i)])]
            nxt = [
                _Hyp(
                    tokens=[*beam[n].tokens, int(token_ids[n, j])],
                    score=float(scores[n, j]),
                    row=n,
                    attention=[*beam[n].attention, attention[n]],
                )
                for n, j in chosen
            ]
            last = t + 1 >= max_len
            for h in nxt:
                if h.tokens[-1] == EOS_ID or last:
                    final.append(self._scored(h, rules))
            beam = [h for h in nxt if h.tokens[-1] != EOS_ID]
            width = len(beam)
            if not beam or last:
                break
        final.sort(key=lambda s: -s.score)  # a stable sort: ties keep the order they finished in
        return final[:K]

    def _scored(self, h: _Hyp, rules: MarianRules) -> Scored:
        length = len(h.tokens)  # `</s>` included when it ended with it
        score = (h.score - rules.word_penalty * length) / length**rules.normalize
        words = [i for i in h.tokens if i != EOS_ID]
        return Scored(
            text=self.tgt_tok.decode(words),
            score=score,
            log_prob=h.score,
            tokens=tuple(h.tokens),
            attention=np.stack(h.attention),
        )
