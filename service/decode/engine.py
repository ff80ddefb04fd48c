"""Text in, hypotheses with alignments out: tokenize → encode → batched beam search → detokenize.

`RunningBatch` is the unit the scheduler drives: sentences join it (encoded together, one encoder call),
every `step()` advances all their hypotheses with one decoder call, and finished sentences leave at once.
`Engine.translate` is the same path for a static batch.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast

import numpy as np

from service.decode import alignment as align
from service.decode.alignment import Alignment
from service.decode.beam import Hypothesis, SearchOptions
from service.decode.config import EngineLimits, RuntimeConfig
from service.decode.controls import Controls, unusable_controls
from service.decode.device_search import DeviceSearch
from service.decode.errors import DecodeFailed, InvalidInput
from service.decode.kept_rows import KeptRows
from service.decode.link_head import load_link_head
from service.decode.options import OPTIONS
from service.decode.options import problems as option_problems
from service.decode.runtime import EncodedSentence, OnnxModel
from service.decode.search import HostSearch, Joining, Search
from service.decode.sides import PairReader, pair_ids
from service.model import glossary as gl
from service.model import graph_contract as contract
from service.model import memory as mem
from service.model import segment
from service.model.bundle import MANIFEST, Bundle, BundleError, load_bundle
from service.model.embedded import resolve_bundle
from service.model.input_rule import InputRejected
from service.model.spelling import control_problem, spelling_problem
from service.model.vocab import TextTokenizer, is_word_level, load_tokenizers

log = logging.getLogger(__name__)

AlignmentMode = Literal["none", "subword", "word"]
ALIGNMENT_MODES: tuple[str, ...] = ("none", "subword", "word")
MAX_CACHED_SEPARATORS = 256


@dataclass(frozen=True)
class TranslationHypothesis:
    text: str
    tokens: list[str]  # target subword pieces
    token_ids: list[int]
    score: float  # normalized (length/coverage penalties applied); ranks the n-best list
    log_prob: float
    alignment: Alignment | None
    finished: bool  # False when cut at the maximum length
    # exp(log_prob / tokens, EOS included): the geometric-mean token probability in [0, 1]; for a
    # segmented input over every segment's tokens (service/model/segment.py). Users threshold it.
    confidence: float = 0.0
    low_confidence: bool = False  # confidence below the threshold in use (Engine.min_confidence)
    segment_confidences: tuple[float, ...] = ()  # a segmented input's, each segment's own
    token_log_probs: tuple[float, ...] = ()  # log P of each token (EOS not listed)
    alternative: Alternative | None = (
        None  # with return_alternatives: its first word after the prefix
    )
    replaced_unknowns: tuple[int, ...] = ()  # token indices of unknowns replaced by a source word
    # a memory's target served as written: the tokens the vocabulary cannot spell (the forced pass
    # read its unknown token), by index into tokens
    unknown_tokens: tuple[int, ...] = ()
    # "memory": the model's memory gave it (service/decode/recall.py); "mixed": a segmented input
    # some of whose segments the memory gave
    origin: str = "model"
    # with markup or protected spans (service/decode/marked.py): the translation of the plain text,
    # which tokens and alignment describe; `text` is then it with the markup put back
    plain_text: str = ""
    # each token's text as `text` writes it, where the tokenizer's own would not (a memory's
    # target as written: a letter the vocabulary cannot spell is no " ⁇ "); () for the tokenizer's
    surfaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class Alternative:
    """The word a hypothesis puts first after the prefix, and its probability there."""

    word: str
    probability: float
    position: int  # the token index where the word starts


@dataclass(frozen=True)
class Translation:
    source: str
    source_tokens: list[str]
    hypotheses: list[TranslationHypothesis]  # best first
    # the glossary terms that apply to the text and what became of each (Engine.glossary_report)
    glossary: tuple[gl.TermUse, ...] = ()


@dataclass(frozen=True)
class Separator:
    """What lies between two segments of a segmented input, on both sides."""

    source_pieces: list[str]  # the separator's source pieces (columns of the joined alignment)
    target_ids: list[int]
    target_pieces: list[str]
    target_text: str  # written between the segments' translations
    target_surfaces: list[str]  # each target piece's text; they join to target_text


@dataclass(frozen=True)
class Prepared:
    """A validated, tokenized source sentence; a segmented one holds its segments, each decoded
    as a sentence of its own, and the separators between them."""

    text: str
    ids: list[
        int
    ]  # the source ids the model reads (a segmented input: its segments' ids, in order)
    pieces: list[str]  # the source tokens reported (a segmented input: segments' and separators')
    segments: tuple[Prepared, ...] = ()  # empty: decoded whole
    separators: tuple[Separator, ...] = ()  # len(segments) - 1

    @property
    def parts(self) -> tuple[Prepared, ...]:
        """The sentences the decoder sees for this input: its segments, or itself."""
        return self.segments or (self,)


KeyT = TypeVar("KeyT", bound=Hashable)


@dataclass(frozen=True)
class DecodeRequest(Generic[KeyT]):
    """One sentence for a running batch, under its caller's key (the worker's: a SentenceKey)."""

    key: KeyT
    sentence: Prepared
    options: SearchOptions
    alignment: AlignmentMode = "subword"
    # each part's controls, computed by the caller (a front process: `RunningBatch.part_controls`
    # on its text side); None: the batch computes them from the options
    controls: tuple[Controls, ...] | None = None


RawParts = list[list[Hypothesis]]  # a sentence's search results: each part's n-best list
# Engine.encode's signature: each sentence's parts' encoder rows, in order (a caller may pass one
# that also keeps them: service/decode/marked.py's link head reads the decode's rows again)
Encoder = Callable[[Sequence[Prepared]], list[list[EncodedSentence]]]


class Engine:
    def __init__(
        self, bundle: Bundle, model: OnnxModel, limits: EngineLimits, graphs: bool = True
    ) -> None:
        """graphs False: the text side alone (`Engine.text_side`): `model` stands in for the ONNX
        Runtime model and runs nothing; the link head is its thresholds alone."""
        self.bundle = bundle
        self.model = model
        self.limits = limits
        self.src_tok, self.tgt_tok = load_tokenizers(bundle)
        self.word_level = is_word_level(self.src_tok) and is_word_level(self.tgt_tok)
        self.cfg = bundle.architecture
        self._keys = itertools.count()
        if graphs:
            check_loaded_bundle(bundle, model, self.src_tok, self.tgt_tok)
        # The longest piece of either vocabulary in UTF-8 bytes: bounds a response's size up front.
        self.max_piece_bytes = max(self.src_tok.max_piece_bytes, self.tgt_tok.max_piece_bytes)
        # Hypotheses below it are marked low_confidence: the server's --min-confidence when set
        # (>= 0), else the manifest's "confidence" threshold, else none (0).
        self.min_confidence = (
            limits.min_confidence
            if limits.min_confidence >= 0
            else bundle.confidence_threshold or 0.0
        )
        self._separators: dict[tuple[str, str], Separator] = {}
        self._device_search_refused: str | None = None  # why this model's search runs on the host
        self.decoding_defaults = check_decoding_defaults(bundle)
        # Align's supervised word aligner, where the bundle ships one (service/decode/link_head.py)
        self.link_head = load_link_head(bundle, graph=graphs)
        # the decode's encoder rows of texts with markup, until the link head reads them
        self.kept_rows = KeptRows()
        # The memory consulted before the model (service/model/memory.py): the bundle's, under the
        # server's file for this model (`user_memory`, set and reloaded by the server)
        self.bundle_memory = (
            self.read_memory(bundle.file(bundle.memory)) if bundle.memory else mem.EMPTY
        )
        self._user_memory = mem.EMPTY
        self.memory = self.bundle_memory  # the entries in force: the server's over the bundle's
        self.user_memory_signature: tuple[str, int, int] | None = None  # the file it was read from
        # The standing glossary (service/model/glossary.py): the bundle's, under the server's file
        # for this model (`user_glossary`, --glossary-dir, set and reloaded by the server)
        self._term_tokens: dict[str, tuple[int, ...]] = {}
        self.continues_word = continuation_pieces(self.tgt_tok, self.word_level)
        self.bundle_glossary = (
            self.read_glossary(bundle.file(bundle.glossary)) if bundle.glossary else gl.EMPTY
        )
        self._user_glossary = gl.EMPTY
        self.glossary = self.bundle_glossary  # the terms in force
        self.user_glossary_signature: tuple[str, int, int] | None = None

    @property
    def user_memory(self) -> mem.Memory:
        """The server's entries for this model (--memory-dir), over the bundle's."""
        return self._user_memory

    @user_memory.setter
    def user_memory(self, memory: mem.Memory) -> None:
        self._user_memory = memory
        self.memory = memory.over(self.bundle_memory)  # one assignment: lookups see old or new

    @property
    def pair_reader(self) -> PairReader:
        """What reading a (source, target) pair needs: Align's and the memory's."""
        return PairReader(self.normalize, self.src_tok, self.tgt_tok, self.limits)

    def read_memory(self, path: Path) -> mem.Memory:
        """A memory file for this model (MemoryFileError naming the file and line of a line that
        does not parse). Each entry is checked as a hit would use it: its source through the input
        rule and within the source limit, the pair as the forced pass reads it (service/decode/
        sides.py: each side within its limit), its target free of control characters. A target
        the vocabulary cannot spell is kept: it is served as written, the unknown marked (a
        memory holds what people wrote). An entry that fails is left out, named in `refused`."""
        reader = self.pair_reader
        # the same words recur (a one-word source is its own sentence; a dictionary's phonemes)
        encode_source = functools.lru_cache(maxsize=4096)(self.src_tok.encode)
        encode_target = functools.lru_cache(maxsize=65536)(self.tgt_tok.encode)

        def check(source: str, target: str) -> None:
            pair_ids(reader, source, target, encode_source, encode_target)
            problem = control_problem(target)
            if problem is not None:
                raise ValueError(f"target: {problem}")

        return mem.read_memory(path, self.normalize, check)

    @property
    def user_glossary(self) -> gl.Glossary:
        """The server's terms for this model (--glossary-dir), over the bundle's."""
        return self._user_glossary

    @user_glossary.setter
    def user_glossary(self, glossary: gl.Glossary) -> None:
        self._user_glossary = glossary
        self.glossary = glossary.over(self.bundle_glossary)  # one assignment, as the memory's

    def read_glossary(self, path: Path) -> gl.Glossary:
        """A glossary file for this model: sources normalized by its input rule, targets the model
        can spell (GlossaryFileError naming the file and line otherwise)."""
        return gl.read_glossary(path, self.normalize, self.term_tokens)

    def term_tokens(self, target: str) -> tuple[int, ...]:
        """A glossary target as the model's target tokens (cached); InvalidInput for one it cannot
        spell (a piece unknown to its vocabulary) or over the limit of tokens a term may have."""
        found = self._term_tokens.get(target)
        if found is not None:
            return found
        ids = tuple(t for t in self.tgt_tok.encode(target) if t != self.cfg.eos_id)
        if not ids:
            raise InvalidInput(f"the target term {target!r} has no target tokens")
        if self.cfg.unk_id in ids:
            unknown = [
                ch
                for ch in dict.fromkeys(target)
                if not ch.isspace() and self.cfg.unk_id in self.tgt_tok.encode(ch)
            ]
            raise InvalidInput(
                f"the target term {target!r} has characters the model's target vocabulary cannot "
                f"spell ({' '.join(unknown) or 'as a whole'}): the model could never write it"
            )
        if len(ids) > self.limits.max_term_tokens:
            raise InvalidInput(
                f"the target term {target!r} is {len(ids)} target tokens long, over the limit of "
                f"{self.limits.max_term_tokens}"
            )
        if len(self._term_tokens) < 4096:
            self._term_tokens[target] = ids
        return ids

    def standing_glossary(self, options: SearchOptions) -> bool:
        """Whether the model's standing glossary applies to a request (not to one that samples or
        asks for alternatives: those are refused a glossary of their own)."""
        return bool(
            len(self.glossary)
            and options.use_glossary
            and options.sampling_topk == 1
            and not options.return_alternatives
        )

    def request_glossary(self, options: SearchOptions) -> gl.Glossary:
        """The request's terms with sources as the model reads them (target-only ones left out)."""
        terms = [gl.Term(self.normalize(s).strip(), t) for s, t in options.glossary if s.strip()]
        return gl.Glossary(tuple(terms))

    def glossary_matches(self, text: str, options: SearchOptions) -> list[gl.Match]:
        """The request's terms and the standing glossary's (the request's win for the same
        source) found in a text, as the model reads it."""
        if not options.glossary and not self.standing_glossary(options):
            return []
        glossary = self.request_glossary(options)
        if self.standing_glossary(options):
            glossary = glossary.over(self.glossary)
        return glossary.find(self.normalize(text))

    def constraints(
        self, text: str, options: SearchOptions, first: bool = True
    ) -> tuple[tuple[int, ...], ...]:
        """The target token sequences a text's translation must contain: its glossary terms and,
        on a first segment, the request's target-only terms. InvalidInput over the limit."""
        targets = [m.term.target for m in self.glossary_matches(text, options)]
        if first:
            targets += [t for s, t in options.glossary if not s.strip()]
        sequences = tuple(dict.fromkeys(self.term_tokens(t) for t in targets))
        if len(sequences) > self.limits.max_glossary_terms:
            raise InvalidInput(
                f"the text holds {len(sequences)} glossary terms, over the limit of "
                f"{self.limits.max_glossary_terms} a text may have"
            )
        return sequences

    def part_constraints(
        self, sentence: Prepared, options: SearchOptions
    ) -> list[tuple[tuple[int, ...], ...]]:
        """The constraints of each part of a sentence (its segments, or itself): each segment's
        own terms; a term of the whole input that no segment holds (it spans a boundary, or a
        separator holds some of it) goes to the first, with the request's target-only terms."""
        if not sentence.segments:
            return [self.constraints(sentence.text, options)]
        parts = [
            self.constraints(p.text, options, first=k == 0) for k, p in enumerate(sentence.parts)
        ]
        held = {seq for part in parts for seq in part}
        whole = [seq for seq in self.constraints(sentence.text, options) if seq not in held]
        if whole:
            parts[0] = tuple(dict.fromkeys(parts[0] + tuple(whole)))
        return parts

    def check_glossary(self, options: SearchOptions) -> None:
        """The request's terms can be used: InvalidInput naming the term otherwise."""
        if not options.glossary:
            return
        for name, value in (
            ("sampling (sampling_topk != 1)", options.sampling_topk != 1),
            ("return_alternatives", options.return_alternatives),
        ):
            if value:
                raise InvalidInput(
                    f"a glossary cannot be combined with {name}: its terms are kept by the beam "
                    "search (lexically constrained), which a sample or an alternative does not run"
                )
        first: dict[str, int] = {}  # a source as the model reads it → its first term's index
        for i, (source, target) in enumerate(options.glossary):
            try:
                key = self.normalize(source).strip() if source.strip() else ""
                self.term_tokens(target)
            except InvalidInput as err:
                raise InvalidInput(f"glossary[{i}] ({source!r} → {target!r}): {err}") from err
            if key and key in first:
                j = first[key]
                raise InvalidInput(
                    f"glossary[{j}] ({options.glossary[j][0]!r} → {options.glossary[j][1]!r}) and "
                    f"glossary[{i}] ({source!r} → {target!r}) have the same source (as the model "
                    f"reads it: {key!r}): a text keeps one term per source; send one of them"
                )
            first.setdefault(key, i)

    def glossary_report(
        self, text: str, options: SearchOptions, best: TranslationHypothesis | None
    ) -> tuple[gl.TermUse, ...]:
        """The terms that apply to a text, the request's and the standing glossary's (its source
        found in the text, or a request's term without one), and what became of each on the best
        hypothesis: kept, overlapped (another term kept over its source) or cut (the hypothesis
        ended at its maximum length before writing it: a finished one holds every term)."""
        if not options.glossary and not self.standing_glossary(options):
            return ()
        sent = {  # the request's terms as the model reads them → (index, the term as sent)
            gl.Term(self.normalize(s).strip(), t): (i, gl.Term(s, t))
            for i, (s, t) in enumerate(options.glossary)
            if s.strip()
        }
        glossary = self.request_glossary(options)
        if self.standing_glossary(options):
            glossary = glossary.over(self.glossary)
        scan = glossary.scan(self.normalize(text))

        def use(term: gl.Term, status: str, instead: gl.Term | None = None) -> gl.TermUse:
            index, shown = sent.get(term, (None, term))
            if status == gl.KEPT and not self.holds(best, term.target):
                status = gl.CUT
            over = None if instead is None else sent.get(instead, (None, instead))[1]
            return gl.TermUse(shown, status, index, over)

        uses = {m.term: use(m.term, gl.KEPT) for m in scan.kept}
        for m, winner in scan.overlapped:
            uses.setdefault(m.term, use(m.term, gl.OVERLAPPED, winner.term))
        for i, (source, target) in enumerate(options.glossary):
            if not source.strip():
                term = gl.Term("", target)
                uses[term] = replace(use(term, gl.KEPT), request_index=i)
        return tuple(sorted(uses.values(), key=report_order))

    def holds(self, hyp: TranslationHypothesis | None, target: str) -> bool:
        """Whether a hypothesis holds a term's target tokens in a row (a finished one does)."""
        if hyp is None or hyp.finished:
            return hyp is not None
        want, ids = self.term_tokens(target), hyp.token_ids
        return any(tuple(ids[t : t + len(want)]) == want for t in range(len(ids) - len(want) + 1))

    def recall(self, text: str) -> tuple[str, ...]:
        """The memory's targets for a text (matched after the input rule), () for none."""
        entries = self.memory
        if not len(entries):
            return ()
        try:
            return entries.lookup(self.normalize(text).strip())
        except InvalidInput:
            return ()  # refused by the input rule: Translate says why

    @classmethod
    def load(
        cls,
        path: str | Path,
        runtime: RuntimeConfig | None = None,
        limits: EngineLimits | None = None,
    ) -> Engine:
        bundle = load_bundle(resolve_bundle(path))
        return cls(bundle, OnnxModel(bundle, runtime or RuntimeConfig()), limits or EngineLimits())

    @classmethod
    def text_side(cls, path: str | Path, model: Any, limits: EngineLimits | None = None) -> Engine:
        """A bundle's text side with no ONNX Runtime session (a front process's): tokenizers, input
        rule, memory, glossary, controls and `translation_of`; `model` stands in for the ONNX
        Runtime model (its providers and transfer ledger, for ModelInfo and the metrics)."""
        bundle = load_bundle(resolve_bundle(path))
        return cls(bundle, model, limits or EngineLimits(), graphs=False)

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
        source = self.normalize(text)
        ids = self.src_tok.encode(source)
        if not ids:
            raise InvalidInput("text has no translatable content after tokenization")
        if len(ids) > self.limits.max_source_tokens:  # the whole input's, segmented or not
            raise InvalidInput(
                f"text is {len(ids)} subword tokens long, over the limit of {self.limits.max_source_tokens}: "
                "split it into shorter sentences"
            )
        whole = Prepared(text=text, ids=ids, pieces=self.src_tok.pieces(ids, source))
        if self.bundle.segmentation is None:
            return whole
        return self.segmented(whole, source)

    def normalize(self, text: str) -> str:
        """The text as this model reads it: after the bundle's input rule (its declared case,
        alphabet and length; InvalidInput when the rule refuses it), as is without one."""
        if self.bundle.input_rule is None:
            return text
        try:
            return self.bundle.input_rule.apply(text)
        except InputRejected as err:
            raise InvalidInput(str(err)) from err

    def segmented(self, whole: Prepared, source: str) -> Prepared:
        """`whole` cut at the bundle's boundaries (service/model/segment.py); itself when there are none."""
        assert self.bundle.segmentation is not None
        split = self.bundle.segmentation.split(source)
        if len(split.segments) < 2:
            return whole
        segments = []
        for text in split.segments:
            ids = self.src_tok.encode(text)
            if not ids:  # a segment with nothing to read: decode the input whole instead
                return whole
            segments.append(Prepared(text=text, ids=ids, pieces=self.src_tok.pieces(ids, text)))
        separators = [self.separator(src, tgt) for src, tgt in split.separators]
        pieces = list(segments[0].pieces)
        for separator, part in zip(separators, segments[1:], strict=True):
            pieces += separator.source_pieces + part.pieces
        return Prepared(
            text=whole.text,
            ids=[i for s in segments for i in s.ids],
            pieces=pieces,
            segments=tuple(segments),
            separators=tuple(separators),
        )

    def separator(self, source: str, target: str) -> Separator:
        """A separator's pieces on both sides (cached: a bundle has a few separators; the cache is
        bounded, as a pattern may match texts without end, e.g. runs of spaces)."""
        found = self._separators.get((source, target))
        if found is None:
            src_ids = self.src_tok.encode(source) if source.strip() else []
            tgt_ids = self.tgt_tok.encode(target) if target.strip() else []
            _, src_pieces = segment.separator_tokens(src_ids, self.src_tok.pieces(src_ids), source)
            tgt_ids, tgt_pieces = segment.separator_tokens(
                tgt_ids, self.tgt_tok.pieces(tgt_ids), target
            )
            surfaces = segment.separator_surfaces(self.tgt_tok.surfaces(tgt_ids), target)
            found = Separator(src_pieces, tgt_ids, tgt_pieces, target, surfaces)
            if len(self._separators) < MAX_CACHED_SEPARATORS:
                self._separators[(source, target)] = found
        return found

    def encode(self, sentences: Sequence[Prepared]) -> list[list[EncodedSentence]]:
        """The encoder rows of each sentence's parts (a segmented one: one per segment), every
        part of every sentence in one encoder call."""
        parts = [p for s in sentences for p in s.parts]
        encoded = self.model.encode_sentences([p.ids for p in parts])
        out, i = [], 0
        for s in sentences:
            n = len(s.parts)
            out.append(encoded[i : i + n])
            i += n
        return out

    def check_options(
        self, options: SearchOptions, alignment: str, texts: int | None = None
    ) -> None:
        """Options within this engine's limits (service/decode/options.py's ranges) and an alignment the
        model can give; InvalidInput says what to change. texts: how many texts the options are for
        (target_prefix gives one prefix per text, or none)."""
        problems = options.problems(self.limits)
        if problems:
            raise InvalidInput("; ".join(problems))
        if texts is not None and options.target_prefix and len(options.target_prefix) != texts:
            raise InvalidInput(
                f"target_prefix has {len(options.target_prefix)} entries for {texts} texts: give "
                'one per text ("" for a text without one), or none'
            )
        self.check_glossary(options)
        if options.replace_unknowns and not self.supports_alignment:
            raise InvalidInput(
                f"model {self.bundle.name} has no attention: replace_unknowns needs it"
            )
        for i in range(max(1, len(options.target_prefix))):
            self.controls(options.for_text(i), prefix_name=f"target_prefix[{i}]")
        if alignment not in ALIGNMENT_MODES:
            raise InvalidInput(f"alignment must be one of {ALIGNMENT_MODES}, got {alignment!r}")
        if alignment != "none" and not self.supports_alignment:
            raise InvalidInput(
                f"model {self.bundle.name} has no attention (architecture 'none'): ask for alignment 'none'"
            )

    def controls(self, options: SearchOptions, prefix_name: str = "target_prefix") -> Controls:
        """One text's decoding controls as token ids: its target prefix and the suppressed
        sequences tokenized as the model's target side (its glossary terms are the text's:
        `part_constraints`). InvalidInput (naming the prefix as `prefix_name`) for a prefix over
        the limit, a prefix a subword target vocabulary cannot spell or a suppress entry any target
        vocabulary cannot (service/model/spelling.py), or a suppress entry with nothing to
        tokenize."""
        prefix: list[int] = []
        if options.target_prefix and options.target_prefix[0].strip():
            # A word vocabulary writes an unknown word as its unknown token, a word it was trained
            # on: the prefix forces it there, as OpenNMT-py's -tgt_file_prefix does. A subword
            # vocabulary has no such word: what it cannot spell is refused.
            word_level = is_word_level(self.tgt_tok)
            unwritable = (
                None if word_level else spelling_problem(self.tgt_tok, options.target_prefix[0])
            )
            if unwritable:
                raise InvalidInput(f"{prefix_name} ({options.target_prefix[0]!r}): {unwritable}")
            prefix = self.tgt_tok.encode(options.target_prefix[0])
            if len(prefix) > self.limits.max_prefix_tokens:
                raise InvalidInput(
                    f"{prefix_name} is {len(prefix)} target tokens long, over the limit of "
                    f"{self.limits.max_prefix_tokens}"
                )
            if prefix and prefix[-1] == self.cfg.eos_id:  # a word tokenizer that appends EOS
                prefix = prefix[:-1]
        suppress = []
        for i, text in enumerate(options.suppress):
            unwritable = spelling_problem(self.tgt_tok, text)
            if unwritable:
                raise InvalidInput(f"suppress[{i}] ({text!r}): {unwritable}")
            ids = [t for t in self.tgt_tok.encode(text) if t != self.cfg.eos_id]
            if not ids:
                raise InvalidInput(f"suppress[{i}] ({text!r}) has no target tokens")
            suppress.append(tuple(ids))
        return Controls(
            prefix=tuple(prefix),
            suppress=tuple(suppress),
            min_length=options.min_length,
            no_repeat_ngram_size=options.no_repeat_ngram_size,
            repetition_penalty=options.repetition_penalty,
            alternatives=options.return_alternatives,
            sampling_topk=options.sampling_topk,
            sampling_topp=options.sampling_topp,
            sampling_temperature=options.sampling_temperature,
            seed=options.seed,
        )

    def sentence_controls(self, sentence: Prepared, options: SearchOptions) -> list[Controls]:
        """The controls of each part of a sentence (its segments, or itself): a prefix, and
        alternatives after it, belong to the first segment; each part has its own glossary terms
        (the request's target-only ones on the first)."""
        control = self.controls(options)
        out = []
        for k, constraints in enumerate(self.part_constraints(sentence, options)):
            part = replace(control, constraints=constraints)
            out.append(replace(part, prefix=(), alternatives=0) if k else part)
        return out

    # --- decoding -----------------------------------------------------------------------------

    def new_batch(self, beam_size: int) -> RunningBatch[Any]:
        return RunningBatch(self, beam_size)

    def searches(self, beam_size: int) -> list[Search]:
        """A running batch's searches, in order of preference: the device search (search
        "device", where the decoder graph takes one: else its reason is logged once and the batch
        decodes on the host, as with search "host"), then the numpy search, which takes every
        sentence."""
        cfg = self.cfg
        narrow = cfg.toolkit != "native"  # imported models: the toolkit's beam rule
        host = HostSearch(
            self.model, beam_size, cfg.bos_id, cfg.eos_id, cfg.tgt_vocab_size, narrow,
            self.continues_word,
        )  # fmt: skip
        if self.model.config.search != "device":
            return [host]
        try:
            device = DeviceSearch(
                self.model, beam_size, cfg.bos_id, cfg.eos_id, cfg.tgt_vocab_size, narrow
            )
        except ValueError as err:
            if self._device_search_refused is None:
                log.warning("%s: the beam search runs on the host: %s", self.bundle.name, err)
            self._device_search_refused = str(err)
            return [host]
        return [device, host]

    def translate(
        self,
        texts: Sequence[str],
        options: SearchOptions | None = None,
        alignment: AlignmentMode = "subword",
        encode: Encoder | None = None,
    ) -> list[Translation]:
        """Decode a static batch: every sentence and beam advance together; results in input order.
        encode: what encodes the sentences (default `Engine.encode`)."""
        options = options or SearchOptions(beam_size=5)
        if not texts:
            raise InvalidInput("no texts to translate")
        self.check_options(options, alignment, len(texts))
        prepared = [self.prepare(t) for t in texts]
        for i, sentence in enumerate(prepared):
            self.check_constraints(sentence, options.for_text(i), f"texts[{i}]")
        return self.decode_prepared(prepared, options, alignment, encode)

    def check_constraints(self, sentence: Prepared, options: SearchOptions, where: str) -> None:
        """The glossary terms of each part of a sentence are within the limit (InvalidInput
        naming `where` otherwise), before it is queued."""
        try:
            parts = self.part_constraints(sentence, options)
        except InvalidInput as err:
            raise InvalidInput(f"{where}: {err}") from err
        if max(len(p) for p in parts) > self.limits.max_glossary_terms:
            raise InvalidInput(
                f"{where}: holds more glossary terms than the limit of "
                f"{self.limits.max_glossary_terms} a text may have"
            )

    def decode_prepared(
        self,
        prepared: Sequence[Prepared],
        options: SearchOptions,
        alignment: AlignmentMode,
        encode: Encoder | None = None,
    ) -> list[Translation]:
        """A static batch of sentences already tokenized and checked, encoded in one call by
        `encode` (default `Engine.encode`); results in input order."""
        batch: RunningBatch[int] = self.new_batch(options.beam_size)
        batch.add(
            [DecodeRequest(i, p, options.for_text(i), alignment) for i, p in enumerate(prepared)],
            (self.encode if encode is None else encode)(prepared) if prepared else [],
        )
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

    def translation_of(self, request: DecodeRequest[Any], parts: RawParts) -> Translation:
        """A sentence's search results (`RunningBatch.step_raw`) as its Translation: one part's
        hypotheses converted, a segmented sentence's segments joined."""
        if request.sentence.segments:
            return self.join_translation(request, parts)
        return self.to_translation(request, parts[0])

    def to_translation(self, request: DecodeRequest[Any], hyps: list[Hypothesis]) -> Translation:
        hypotheses = [self.to_hypothesis(request, h) for h in hyps]
        if request.options.return_alternatives:
            hypotheses = self.alternatives(request, hypotheses)
        return Translation(
            source=request.sentence.text,
            source_tokens=request.sentence.pieces,
            hypotheses=hypotheses,
            glossary=self.glossary_report(
                request.sentence.text, request.options, hypotheses[0] if hypotheses else None
            ),
        )

    def alternatives(
        self, request: DecodeRequest[Any], hyps: list[TranslationHypothesis]
    ) -> list[TranslationHypothesis]:
        """The hypotheses of return_alternatives → one per distinct first word after the prefix,
        by that word's probability (summed over the hypotheses that spell it), the best
        continuation of each kept, return_alternatives of them."""
        start = len(self.controls(request.options).prefix)
        best: dict[str, TranslationHypothesis] = {}
        mass: dict[str, float] = {}
        for hyp in hyps:
            found = self.first_word(hyp, start)
            if found is None:
                continue
            word, log_prob = found
            mass[word] = mass.get(word, 0.0) + math.exp(log_prob)
            if word not in best or hyp.score > best[word].score:
                best[word] = hyp
        ranked = sorted(best, key=lambda w: -mass[w])[: request.options.return_alternatives]
        return [
            replace(best[w], alternative=Alternative(w, min(1.0, mass[w]), start)) for w in ranked
        ]

    def first_word(self, hyp: TranslationHypothesis, start: int) -> tuple[str, float] | None:
        """The word that starts at token `start` of hyp, and its pieces' summed log-prob (None
        when the hypothesis ends there)."""
        ids = hyp.token_ids
        if start >= len(ids):
            return None
        end = start + 1
        if not self.word_level:  # a word's later pieces carry no "▁"
            pieces = self.tgt_tok.pieces(ids)
            marks = align.word_index(pieces)  # (P,)
            while end < len(ids) and marks[end] == marks[start]:
                end += 1
        word = self.tgt_tok.decode(ids[start:end]).strip()
        return word, float(sum(hyp.token_log_probs[start:end]))

    def alignment_mode(self, request: DecodeRequest[Any]) -> AlignmentMode:
        return self.alignment_mode_for(request.alignment)

    def alignment_mode_for(self, alignment: AlignmentMode) -> AlignmentMode:
        """The matrix an alignment mode gives on this model (word level: its tokens are words)."""
        return "subword" if self.word_level and alignment == "word" else alignment

    def to_hypothesis(
        self, request: DecodeRequest[Any], hyp: Hypothesis, mode: AlignmentMode | None = None
    ) -> TranslationHypothesis:
        """mode: the alignment's (default: the request's); "subword" keeps the raw matrix."""
        mode = mode or self.alignment_mode(request)
        pieces = self.tgt_tok.pieces(hyp.tokens)
        confidence = segment.geometric_mean_probability(
            float(hyp.log_prob), len(hyp.tokens), hyp.finished_by_eos
        )
        text, replaced = self.tgt_tok.decode(hyp.tokens), tuple[int, ...]()
        if request.options.replace_unknowns and hyp.attention is not None:
            text, replaced = self.replace_unknowns(request.sentence, hyp)
        if request.alignment == "none":
            hyp = replace(hyp, attention=None)  # kept only for replace_unknowns
        elif hyp.attention is not None and (request.options.glossary or len(self.glossary)):
            attention = self.term_rows(request.sentence, request.options, hyp)
            hyp = replace(hyp, attention=attention)
        token_log_probs = () if hyp.token_log_probs is None else tuple(hyp.token_log_probs.tolist())
        return TranslationHypothesis(
            text=text,
            tokens=pieces,
            token_ids=list(hyp.tokens),
            score=float(hyp.score),
            log_prob=float(hyp.log_prob),
            alignment=make_alignment(
                hyp.attention,
                request.sentence.pieces,
                pieces,
                mode,
                self.tgt_tok.surfaces(hyp.tokens) if mode == "word" else None,
                source_text=request.sentence.text,
            ),
            finished=hyp.finished_by_eos,
            confidence=confidence,
            low_confidence=confidence < self.min_confidence,
            token_log_probs=token_log_probs,
            replaced_unknowns=replaced,
        )

    def term_rows(self, sentence: Prepared, options: SearchOptions, hyp: Hypothesis) -> np.ndarray:
        """hyp's attention (T, S) with each glossary term's rows on its source term's pieces, 1/n
        each: the search forced the term, so the row that produced it did not choose it."""
        assert hyp.attention is not None
        matches = self.glossary_matches(sentence.text, options)
        normalized = self.normalize(sentence.text)
        spans = align.word_spans(normalized)  # (W,) the text's whitespace words
        marks = align.word_index(sentence.pieces)  # (S,) each source piece's word
        if (
            not matches
            or len(marks) != hyp.attention.shape[1]
            or int(marks.max()) + 1 != len(spans)
        ):
            return hyp.attention
        columns: dict[tuple[int, ...], np.ndarray] = {}  # a term's target → its source pieces
        for match in matches:
            words = [w for w, (s, e) in enumerate(spans) if s < match.end and e > match.start]
            sequence = self.term_tokens(match.term.target)
            found = columns.get(sequence, np.zeros(len(marks), bool))
            columns[sequence] = found | np.isin(marks, words)  # (S,) every place it occurs
        out = hyp.attention.copy()  # (T, S)
        tokens = list(hyp.tokens)
        for sequence, where in columns.items():
            n = len(sequence)
            for t in range(len(tokens) - n + 1):
                if tuple(tokens[t : t + n]) == sequence and where.any():
                    out[t : t + n] = where / where.sum()
        return out

    def replace_unknowns(self, sentence: Prepared, hyp: Hypothesis) -> tuple[str, tuple[int, ...]]:
        """The hypothesis's text with each unknown target token replaced by the source word its
        attention row weighs most (Luong et al., 2015; OpenNMT-py's -replace_unk), and the indices
        of the tokens replaced. Source words are the client's whitespace words where the pieces
        group into as many, else the pieces themselves."""
        unknown = [i for i, t in enumerate(hyp.tokens) if t == self.cfg.unk_id]
        if not unknown or hyp.attention is None:
            return self.tgt_tok.decode(hyp.tokens), ()
        words = sentence.text.split()
        if is_word_level(self.src_tok):  # a piece per word (then the toolkit's source EOS, if any)
            marks = np.arange(len(sentence.pieces))  # (S,)
        else:
            marks = align.word_index(sentence.pieces)  # (S,) each source piece's word
            if len(marks) and int(marks.max()) + 1 != len(words):  # not the client's words
                words = []
        surfaces = self.tgt_tok.surfaces(hyp.tokens)
        for i in unknown:
            j = int(np.argmax(hyp.attention[i]))
            w = int(marks[j])
            word = words[w] if w < len(words) else sentence.pieces[j].replace(align.WORD_START, "")
            surfaces[i] = (" " if i > 0 else "") + word
        return "".join(surfaces).strip(), tuple(unknown)

    def join_translation(
        self, request: DecodeRequest[Any], parts: list[list[Hypothesis]]
    ) -> Translation:
        """A segmented input's translation from its segments' n-best lists (service/model/segment.py
        says how they join)."""
        sentence = request.sentence
        mode = self.alignment_mode(request)
        raw: AlignmentMode = "none" if mode == "none" else "subword"
        converted = [
            [self.to_hypothesis(replace(request, sentence=seg), h, raw) for h in hyps]
            for seg, hyps in zip(sentence.segments, parts, strict=True)
        ]
        n = max(len(hyps) for hyps in converted)
        hypotheses = [
            self.join_hypotheses(
                [hyps[min(i, len(hyps) - 1)] for hyps in converted], sentence, mode
            )
            for i in range(n)
        ]
        return Translation(
            source=sentence.text,
            source_tokens=sentence.pieces,
            hypotheses=hypotheses,
            glossary=self.glossary_report(sentence.text, request.options, hypotheses[0]),
        )

    def joined_surfaces(self, parts: list[TranslationHypothesis], sentence: Prepared) -> list[str]:
        """The joined hypothesis's target surfaces: they join to its text (segments' and
        separators' text in order)."""
        blocks = [(self.written_surfaces(parts[0]), parts[0].text)]
        for separator, part in zip(sentence.separators, parts[1:], strict=True):
            blocks.append((separator.target_surfaces, separator.target_text))
            blocks.append((self.written_surfaces(part), part.text))
        return segment.join_surfaces(blocks)

    def written_surfaces(self, hyp: TranslationHypothesis) -> list[str]:
        """Each of hyp's tokens' text as its answer writes it."""
        return list(hyp.surfaces) if hyp.surfaces else self.tgt_tok.surfaces(hyp.token_ids)

    def join_hypotheses(
        self, parts: list[TranslationHypothesis], sentence: Prepared, mode: AlignmentMode
    ) -> TranslationHypothesis:
        """One hypothesis per segment (raw subword alignments) → the input's hypothesis."""
        first = parts[0]
        text, tokens, ids = first.text, list(first.tokens), list(first.token_ids)
        token_log_probs = list(first.token_log_probs)
        unknown = list(first.unknown_tokens)
        for separator, part in zip(sentence.separators, parts[1:], strict=True):
            text += separator.target_text + part.text
            start = len(tokens) + len(separator.target_pieces)
            unknown += [start + i for i in part.unknown_tokens]
            tokens += separator.target_pieces + part.tokens
            ids += separator.target_ids + part.token_ids
            # a separator's tokens are written, not decoded: probability 1
            token_log_probs += [0.0] * len(separator.target_ids) + list(part.token_log_probs)
        alignment = None
        matrices = [p.alignment.matrix for p in parts if p.alignment is not None]
        if mode != "none" and len(matrices) == len(parts):
            matrix = segment.block_diagonal(
                matrices,
                [(len(s.target_pieces), len(s.source_pieces)) for s in sentence.separators],
            )  # (T, S)
            alignment = make_alignment(
                matrix,
                sentence.pieces,
                tokens,
                mode,
                self.joined_surfaces(parts, sentence),
                source_text=sentence.text,
                unknown=unknown,
            )
        scored = sum(len(p.token_ids) + (1 if p.finished else 0) for p in parts)
        log_prob = sum(p.log_prob for p in parts)
        confidence = math.exp(log_prob / scored) if scored else 0.0
        return TranslationHypothesis(
            text=text,
            tokens=tokens,
            token_ids=ids,
            score=sum(p.score for p in parts),
            log_prob=log_prob,
            alignment=alignment,
            finished=all(p.finished for p in parts),
            confidence=confidence,
            low_confidence=confidence < self.min_confidence,
            segment_confidences=tuple(p.confidence for p in parts),
            token_log_probs=tuple(token_log_probs),
            unknown_tokens=tuple(unknown),
        )


def report_order(use: gl.TermUse) -> tuple[bool, int]:
    """A glossary report's order: the request's terms as it sent them, then the model's own."""
    return (use.request_index is None, use.request_index or 0)


EntryT = TypeVar("EntryT")


def by_encoder_call(
    entries: Sequence[EntryT], encoded: Callable[[EntryT], EncodedSentence]
) -> list[EntryT]:
    """The entries with the sentences of each encoder call together, in order of first
    appearance (stable)."""
    calls: dict[int, int] = {}
    for entry in entries:
        calls.setdefault(id(encoded(entry).batch), len(calls))
    return sorted(entries, key=lambda entry: calls[id(encoded(entry).batch)])


def continuation_pieces(tokenizer: TextTokenizer, word_level: bool) -> np.ndarray | None:
    """(V,) bool: the target pieces that go on with the word before them (no word start, and a
    letter or digit first: a comma may follow a word); None for a word-level vocabulary."""
    if word_level:
        return None
    pieces = tokenizer.pieces(list(range(tokenizer.vocab_size)))
    return np.array([not p.startswith(align.WORD_START) and p[:1].isalnum() for p in pieces], bool)


def check_decoding_defaults(bundle: Bundle) -> dict[str, Any]:
    """The manifest's "decoding" defaults, every name a decoding option and every value in its
    range (BundleError naming the manifest otherwise)."""
    known = {spec.name: spec for spec in OPTIONS}
    unknown = sorted(set(bundle.decoding) - set(known))
    if unknown:
        raise BundleError(
            f"{bundle.path / MANIFEST}: 'decoding' names unknown options {unknown} "
            f"(known: {sorted(known)})"
        )
    values = {name: _default_value(known[name].kind, v) for name, v in bundle.decoding.items()}
    found = option_problems({**SearchOptions().values(), **values})
    if found:
        raise BundleError(f"{bundle.path / MANIFEST}: 'decoding': " + "; ".join(found))
    return values


def _default_value(kind: type, value: Any) -> Any:
    """A manifest default as its option's type (a list of strings for a repeated option)."""
    if kind is tuple:
        return tuple(value) if isinstance(value, list) else value
    if kind in (int, float) and isinstance(value, int | float) and not isinstance(value, bool):
        return kind(value)
    return value  # a value of another type: the option's check names it


def check_loaded_bundle(
    bundle: Bundle, model: OnnxModel, source: TextTokenizer, target: TextTokenizer
) -> None:
    """The graphs keep the runtime's contract and the tokenizers agree with the manifest
    (BundleError naming the file otherwise): see service/model/graph_contract.py."""
    decoder_file = "decoder.int8.onnx" if model.config.int8_decoder else "decoder.onnx"
    for role, inputs, outputs, name in (
        ("encoder", model.encoder.get_inputs(), model.encoder.get_outputs(), "encoder.onnx"),
        ("decoder", model.decoder_inputs(), model.decoder.get_outputs(), decoder_file),
    ):
        contract.check_graph(bundle.file(name), role, inputs, outputs, bundle.architecture)
    contract.check_vocabularies(bundle.file(MANIFEST), bundle.architecture, source, target)


def make_alignment(
    matrix: np.ndarray | None,
    src_pieces: list[str],
    tgt_pieces: list[str],
    mode: AlignmentMode,
    tgt_surfaces: list[str] | None = None,
    source_text: str | None = None,
    unknown: Sequence[int] = (),
) -> Alignment | None:
    """tgt_surfaces: each target piece's text as the answer writes it (the tokenizer's
    `surfaces`), so that word mode's target words are the answer text's words. At word level the
    source words are the client's whitespace words of `source_text` (as sent: not lower-cased by
    the input rule, no <unk> for unknown letters) whenever the pieces group into as many words.
    unknown: the target pieces the vocabulary cannot spell (a memory's target as written), marked
    on the rows that hold them."""
    if mode == "none" or matrix is None:
        return None
    rows = tuple(unknown)
    if mode == "word":
        rows = align.words_holding(tgt_pieces, unknown, tgt_surfaces)
        matrix, src_pieces, tgt_pieces = align.merge_subwords(
            matrix, src_pieces, tgt_pieces, tgt_surfaces=tgt_surfaces
        )
        sent = source_text.split() if source_text is not None else []
        if len(sent) == len(src_pieces):
            src_pieces = sent
    return Alignment(
        matrix=matrix,
        source_tokens=src_pieces,
        target_tokens=tgt_pieces,
        pharaoh=align.pharaoh(matrix),
        unknown_target_tokens=rows,
    )


class RunningBatch(Generic[KeyT]):
    """Sentences decoding together with K hypothesis slots each; sentences join and leave between
    steps. Sentences are known by their requests' keys. A segmented sentence decodes as one search
    entry per segment (keyed (key, k)) and leaves when its last segment finishes, joined.

    The batch holds its searches in order of preference (`Engine.searches`: the device search,
    where the model's graph takes one, then the numpy search, which takes every sentence) and gives
    each sentence to the first that takes its controls (service/decode/search.py); a step runs
    each that holds sentences: a batch without the controls the device cannot apply makes one
    device call a step (docs/decoding.md says which control takes which path)."""

    def __init__(self, engine: Engine, beam_size: int) -> None:
        self.engine = engine
        self.searches: list[Search] = engine.searches(beam_size)
        self.requests: dict[Hashable, DecodeRequest[KeyT]] = {}
        # segmented sentences: key → each segment's n-best list, None while it decodes
        self.segments: dict[Hashable, list[list[Hypothesis] | None]] = {}
        # requests that failed on their own (their controls), for `take_failed`: the batch goes on
        self.failed: list[tuple[DecodeRequest[KeyT], Exception]] = []

    @property
    def beam_size(self) -> int:
        return self.searches[0].beam_size

    def __len__(self) -> int:
        """The sentences (segments) the decoder steps: what the batch limits count."""
        return sum(len(search) for search in self.searches)

    @property
    def num_hypotheses(self) -> int:
        return len(self) * self.beam_size

    def add(
        self,
        requests: Sequence[DecodeRequest[KeyT]],
        encoded: Sequence[Sequence[EncodedSentence]] | None = None,
    ) -> None:
        """Append the joining sentences; encoded[i] holds requests[i]'s parts' rows (Engine.encode;
        None: encode them now, in one encoder call)."""
        if not requests:
            return
        if encoded is None:
            encoded = self.engine.encode([r.sentence for r in requests])
        if len(encoded) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(encoded)} encoded sentences")
        for request, rows in zip(requests, encoded, strict=True):
            if len(rows) != len(request.sentence.parts):
                raise ValueError(
                    f"{len(request.sentence.parts)} segments but {len(rows)} encoded rows"
                )
        # InvalidInput before any join
        controls = [
            list(r.controls) if r.controls is not None else self.part_controls(r) for r in requests
        ]
        routed: dict[int, list[Joining]] = {i: [] for i in range(len(self.searches))}
        V = self.engine.cfg.tgt_vocab_size
        for request, control, rows in zip(requests, controls, encoded, strict=True):
            problem = next(filter(None, (unusable_controls(c, V) for c in control)), None)
            if problem:  # this request fails alone (a front that tokenized for another model)
                error = DecodeFailed(f"this text's decoding controls cannot decode: {problem}")
                self.failed.append((request, error))
                continue
            for entry in self.joining(request, control, rows):
                routed[self.search_for(entry.controls)].append(entry)
            parts = request.sentence.segments
            if parts:
                self.segments[request.key] = [None] * len(parts)
            self.requests[request.key] = request
        # in the running batch, the sentences of one encoder call side by side: their rows join
        # it in one device call (their order there is free: an answer does not depend on it)
        for i, group in routed.items():
            self.searches[i].add(by_encoder_call(group, lambda j: j.encoded))

    def joining(
        self,
        request: DecodeRequest[KeyT],
        controls: Sequence[Controls],
        rows: Sequence[EncodedSentence],
    ) -> list[Joining]:
        """A request's search entries: its sentence, or each of its segments (keyed (key, k))."""
        options = request.options
        want_attention = request.alignment != "none" or options.replace_unknowns
        if options.return_attention != want_attention:
            options = replace(options, return_attention=want_attention)
        parts = request.sentence.segments
        keys: list[Hashable] = (
            [request.key] if not parts else [(request.key, k) for k in range(len(parts))]
        )
        return [
            Joining(key, encoded, options, part_controls)
            for key, part_controls, encoded in zip(keys, controls, rows, strict=True)
        ]

    def search_for(self, controls: Controls) -> int:
        """The first of the batch's searches that takes a sentence with these controls."""
        return next(i for i, search in enumerate(self.searches) if search.takes(controls))

    def part_controls(self, request: DecodeRequest[KeyT]) -> list[Controls]:
        """The controls of each part of a request's sentence (`Engine.sentence_controls`)."""
        return self.engine.sentence_controls(request.sentence, request.options)

    def take_failed(self) -> list[tuple[DecodeRequest[KeyT], Exception]]:
        """The requests that failed on their own since the last call (their controls could not
        decode, when they joined or at a step), each with its error; the batch went on without
        them."""
        failed, self.failed = self.failed, []
        return failed

    def remove(self, keys: Collection[KeyT]) -> list[KeyT]:
        """Drop sentences mid-decode (their client went away); returns the keys that were here."""
        present = [key for key in keys if key in self.requests]
        entries: list[Hashable] = []
        for key in present:
            parts = self.segments.pop(key, None)
            entries += [key] if parts is None else [(key, k) for k in range(len(parts))]
        for search in self.searches:
            search.remove(entries)
        return [self.requests.pop(key).key for key in present]

    def step(self) -> list[tuple[KeyT, Translation]]:
        """One decoder call for every hypothesis (one per search holding sentences); returns the
        sentences that finished at this step."""
        return [
            (request.key, self.engine.translation_of(request, parts))
            for request, parts in self.step_raw()
        ]

    def step_raw(self) -> list[tuple[DecodeRequest[KeyT], RawParts]]:
        """As `step`, the finished sentences' search results left as they are (each part's n-best
        list): a front process turns them into Translations (`Engine.translation_of`)."""
        out: list[tuple[DecodeRequest[KeyT], RawParts]] = []
        finished: list[tuple[Hashable, list[Hypothesis]]] = []
        for search in self.searches:
            if len(search):
                finished += search.step()
            self.fail_entries(search.take_failed())
        for entry, hyps in finished:
            if entry in self.requests and entry not in self.segments:
                out.append((self.requests.pop(entry), [hyps]))
                continue
            key, k = cast(tuple[Hashable, int], entry)  # a segment of a segmented sentence
            parts = self.segments.get(key)
            if parts is None:
                continue  # another of its segments failed at this step
            parts[k] = hyps
            if all(p is not None for p in parts):
                del self.segments[key]
                out.append((self.requests.pop(key), [p for p in parts if p is not None]))
        return out

    def fail_entries(self, failed: Sequence[tuple[Hashable, Exception]]) -> None:
        """Search entries that failed on their own: their requests fail (a segmented one's other
        segments leave the batch with it), for `take_failed`."""
        for entry, error in failed:
            whole = entry in self.requests and entry not in self.segments
            key = entry if whole else cast(tuple[Hashable, int], entry)[0]
            if key not in self.requests:
                continue  # another segment of it failed first
            request = self.requests[key]
            self.remove([request.key])
            log.error("a sentence's decoding controls failed: %r", error, exc_info=error)
            why = DecodeFailed(f"this text's decoding controls failed: {error!r}; logged")
            self.failed.append((request, why))
