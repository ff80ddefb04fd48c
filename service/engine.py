"""Text in, hypotheses with alignments out: tokenize → encode → batched beam search → detokenize.

`RunningBatch` is the unit the scheduler drives: sentences join it (encoded together, one encoder call),
every `step()` advances all their hypotheses with one decoder call, and finished sentences leave at once.
`Engine.translate` is the same path for a static batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import numpy as np

from service import alignment as align
from service import graph_contract as contract
from service.alignment import Alignment
from service.beam import BeamSearch, Hypothesis, SearchOptions
from service.bundle import MANIFEST, Bundle, load_bundle
from service.config import EngineLimits, RuntimeConfig
from service.embedded import resolve_bundle
from service.errors import InvalidInput
from service.input_rule import InputRejected
from service.runtime import EncodedSentence, OnnxDecoder, OnnxModel
from service.vocab import TextTokenizer, is_word_level, load_tokenizers

AlignmentMode = Literal["none", "subword", "word"]
ALIGNMENT_MODES: tuple[str, ...] = ("none", "subword", "word")


@dataclass(frozen=True)
class TranslationHypothesis:
    text: str
    tokens: list[str]  # target subword pieces
    token_ids: list[int]
    score: float  # normalized (length/coverage penalties applied); ranks the n-best list
    log_prob: float
    alignment: Alignment | None
    finished: bool  # False when cut at the maximum length


@dataclass(frozen=True)
class Translation:
    source: str
    source_tokens: list[str]
    hypotheses: list[TranslationHypothesis]  # best first


@dataclass(frozen=True)
class Prepared:
    """A validated, tokenized source sentence."""

    text: str
    ids: list[int]
    pieces: list[str]


KeyT = TypeVar("KeyT", bound=Hashable)


@dataclass(frozen=True)
class DecodeRequest(Generic[KeyT]):
    """One sentence for a running batch, under its caller's key (the worker's: a SentenceKey)."""

    key: KeyT
    sentence: Prepared
    options: SearchOptions
    alignment: AlignmentMode = "subword"


class Engine:
    def __init__(self, bundle: Bundle, model: OnnxModel, limits: EngineLimits) -> None:
        self.bundle = bundle
        self.model = model
        self.limits = limits
        self.src_tok, self.tgt_tok = load_tokenizers(bundle)
        self.word_level = is_word_level(self.src_tok) and is_word_level(self.tgt_tok)
        self.cfg = bundle.architecture
        self._keys = itertools.count()
        check_loaded_bundle(bundle, model, self.src_tok, self.tgt_tok)
        # The longest piece of either vocabulary in UTF-8 bytes: bounds a response's size up front.
        self.max_piece_bytes = max(self.src_tok.max_piece_bytes, self.tgt_tok.max_piece_bytes)

    @classmethod
    def load(
        cls,
        path: str | Path,
        runtime: RuntimeConfig | None = None,
        limits: EngineLimits | None = None,
    ) -> Engine:
        bundle = load_bundle(resolve_bundle(path))
        return cls(bundle, OnnxModel(bundle, runtime or RuntimeConfig()), limits or EngineLimits())

    @property
    def supports_alignment(self) -> bool:
        return self.cfg.attention != "none"

    # --- validation -------------------------------------------------------------------------

    def prepare(self, text: str) -> Prepared:
        """Tokenize one source text; empty or over-long input is InvalidInput."""
        if not isinstance(text, str):
            raise InvalidInput(f"text must be a string, got {type(text).__name__}")
        if not text.strip():
            raise InvalidInput(
                "text is empty or only whitespace: send at least one word to translate"
            )
        source = text
        if self.bundle.input_rule is not None:  # the bundle's declared alphabet and length
            try:
                source = self.bundle.input_rule.apply(text)
            except InputRejected as err:
                raise InvalidInput(str(err)) from err
        ids = self.src_tok.encode(source)
        if not ids:
            raise InvalidInput("text has no translatable content after tokenization")
        if len(ids) > self.limits.max_source_tokens:
            raise InvalidInput(
                f"text is {len(ids)} subword tokens long, over the limit of {self.limits.max_source_tokens}: "
                "split it into shorter sentences"
            )
        return Prepared(text=text, ids=ids, pieces=self.src_tok.pieces(ids))

    def check_options(self, options: SearchOptions, alignment: str) -> None:
        """Options within this engine's limits (service/options.py's ranges) and an alignment the
        model can give; InvalidInput says what to change."""
        problems = options.problems(self.limits)
        if problems:
            raise InvalidInput("; ".join(problems))
        if alignment not in ALIGNMENT_MODES:
            raise InvalidInput(f"alignment must be one of {ALIGNMENT_MODES}, got {alignment!r}")
        if alignment != "none" and not self.supports_alignment:
            raise InvalidInput(
                f"model {self.bundle.name} has no attention (architecture 'none'): ask for alignment 'none'"
            )

    # --- decoding -----------------------------------------------------------------------------

    def new_batch(self, beam_size: int) -> RunningBatch[Any]:
        return RunningBatch(self, beam_size)

    def translate(
        self,
        texts: Sequence[str],
        options: SearchOptions | None = None,
        alignment: AlignmentMode = "subword",
    ) -> list[Translation]:
        """Decode a static batch: every sentence and beam advance together; results in input order."""
        options = options or SearchOptions(beam_size=5)
        if not texts:
            raise InvalidInput("no texts to translate")
        self.check_options(options, alignment)
        return self.decode_prepared([self.prepare(t) for t in texts], options, alignment)

    def decode_prepared(
        self, prepared: Sequence[Prepared], options: SearchOptions, alignment: AlignmentMode
    ) -> list[Translation]:
        """A static batch of sentences already tokenized and checked; results in input order."""
        batch: RunningBatch[int] = self.new_batch(options.beam_size)
        batch.add([DecodeRequest(i, p, options, alignment) for i, p in enumerate(prepared)])
        results: dict[int, Translation] = {}
        while len(batch):
            results.update(batch.step())
        return [results[i] for i in range(len(prepared))]

    def warm_up(self) -> None:
        """Decode once at several batch shapes so the first real request pays no first-run costs.
        From token ids rather than texts: a bundle's input rule may refuse any text chosen here."""
        first = max(self.cfg.pad_id, self.cfg.bos_id, self.cfg.eos_id, self.cfg.unk_id) + 1
        span = max(1, self.cfg.src_vocab_size - first)

        def sentence(n: int) -> Prepared:
            ids = [first + i % span for i in range(n)]
            return Prepared(text="", ids=ids, pieces=self.src_tok.pieces(ids))

        self.decode_prepared([sentence(1)], SearchOptions(beam_size=1, max_length_b=4), "none")
        alignment: AlignmentMode = "subword" if self.supports_alignment else "none"
        self.decode_prepared(
            [sentence(3), sentence(1)], SearchOptions(beam_size=4, max_length_b=4), alignment
        )

    def to_translation(self, request: DecodeRequest[Any], hyps: list[Hypothesis]) -> Translation:
        return Translation(
            source=request.sentence.text,
            source_tokens=request.sentence.pieces,
            hypotheses=[self.to_hypothesis(request, h) for h in hyps],
        )

    def to_hypothesis(self, request: DecodeRequest[Any], hyp: Hypothesis) -> TranslationHypothesis:
        pieces = self.tgt_tok.pieces(hyp.tokens)
        return TranslationHypothesis(
            text=self.tgt_tok.decode(hyp.tokens),
            tokens=pieces,
            token_ids=list(hyp.tokens),
            score=float(hyp.score),
            log_prob=float(hyp.log_prob),
            alignment=make_alignment(
                hyp.attention,
                request.sentence.pieces,
                pieces,
                "subword" if self.word_level and request.alignment == "word" else request.alignment,
            ),
            finished=hyp.finished_by_eos,
        )


def check_loaded_bundle(
    bundle: Bundle, model: OnnxModel, source: TextTokenizer, target: TextTokenizer
) -> None:
    """The graphs keep the runtime's contract and the tokenizers agree with the manifest
    (BundleError naming the file otherwise): see service/graph_contract.py."""
    decoder_file = "decoder.int8.onnx" if model.config.int8_decoder else "decoder.onnx"
    for role, session, name in (
        ("encoder", model.encoder, "encoder.onnx"),
        ("decoder", model.decoder, decoder_file),
    ):
        contract.check_graph(
            bundle.file(name),
            role,
            session.get_inputs(),
            session.get_outputs(),
            bundle.architecture,
        )
    contract.check_vocabularies(bundle.file(MANIFEST), bundle.architecture, source, target)


def make_alignment(
    matrix: np.ndarray | None, src_pieces: list[str], tgt_pieces: list[str], mode: AlignmentMode
) -> Alignment | None:
    if mode == "none" or matrix is None:
        return None
    if mode == "word":
        matrix, src_pieces, tgt_pieces = align.merge_subwords(matrix, src_pieces, tgt_pieces)
    return Alignment(
        matrix=matrix,
        source_tokens=src_pieces,
        target_tokens=tgt_pieces,
        pharaoh=align.pharaoh(matrix),
    )


class RunningBatch(Generic[KeyT]):
    """Sentences decoding together with K hypothesis slots each; sentences join and leave between
    steps. Sentences are known by their requests' keys."""

    def __init__(self, engine: Engine, beam_size: int) -> None:
        self.engine = engine
        self.decoder: OnnxDecoder = engine.model.new_decoder()
        cfg = engine.cfg
        self.search = BeamSearch(
            self.decoder,
            beam_size,
            cfg.bos_id,
            cfg.eos_id,
            vocab_size=cfg.tgt_vocab_size,
            narrow_on_eos=cfg.toolkit != "native",  # imported models: the toolkit's beam rule
        )
        self.requests: dict[Hashable, DecodeRequest[KeyT]] = {}

    @property
    def beam_size(self) -> int:
        return self.search.beam_size

    def __len__(self) -> int:
        return len(self.search)

    @property
    def num_hypotheses(self) -> int:
        return len(self.search) * self.search.beam_size

    def add(
        self,
        requests: Sequence[DecodeRequest[KeyT]],
        encoded: Sequence[EncodedSentence] | None = None,
    ) -> None:
        """Append the joining sentences; encoded[i] belongs to requests[i] (None: encode them now,
        in one encoder call)."""
        if not requests:
            return
        if encoded is None:
            encoded = self.engine.model.encode_sentences([r.sentence.ids for r in requests])
        if len(encoded) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(encoded)} encoded sentences")
        first_row = self.decoder.add_sentences(encoded)
        for i, request in enumerate(requests):
            options = request.options
            want_attention = request.alignment != "none"
            if options.return_attention != want_attention:
                options = replace(options, return_attention=want_attention)
            self.search.add(
                request.key, len(request.sentence.ids), options, state_row=first_row + i
            )
            self.requests[request.key] = request

    def remove(self, keys: Collection[KeyT]) -> list[KeyT]:
        """Drop sentences mid-decode (their client went away); returns the keys that were here."""
        removed = [self.requests.pop(key).key for key in self.search.remove(keys)]
        return removed

    def step(self) -> list[tuple[KeyT, Translation]]:
        """One decoder call for every hypothesis; returns the sentences that finished at this step."""
        finished = [(self.requests.pop(key), hyps) for key, hyps in self.search.step()]
        return [(r.key, self.engine.to_translation(r, hyps)) for r, hyps in finished]
