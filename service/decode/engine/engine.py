"""Text in, hypotheses with alignments out: tokenize → encode → batched beam search → detokenize.

`RunningBatch` is the unit the scheduler drives: sentences join it (encoded together, one encoder call),
every `step()` advances all their hypotheses with one decoder call, and finished sentences leave at once.
`Engine.translate` is the same path for a static batch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import numpy as np

from service.decode.engine.kept_rows import KeptRows
from service.decode.runtime.encoded import EncodedSentence
from service.decode.runtime.link_head import load_link_head
from service.decode.runtime.runtime import OnnxModel
from service.decode.search.beam import SearchOptions
from service.decode.search.device_search import DeviceSearch
from service.decode.search.search import HostSearch, Joining, Search
from service.decode.shared import alignment as align
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.decode.shared.controls import Controls, unusable_controls
from service.decode.shared.errors import DecodeFailed, InvalidInput
from service.decode.shared.options import OPTIONS
from service.decode.shared.options import problems as option_problems
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import DecodeRequest, KeyT, Prepared, Preparer, RawParts
from service.decode.text.results import Results
from service.decode.text.sides import PairReader, pair_ids
from service.decode.text.terms import Terms
from service.decode.text.translation import ALIGNMENT_MODES, AlignmentMode, Translation
from service.model import graph_contract as contract
from service.model import memory as mem
from service.model.architecture import NARROWING_TOOLKITS
from service.model.bundle import MANIFEST, Bundle, BundleError, load_bundle
from service.model.embedded import resolve_bundle
from service.model.spelling import control_problem, spelling_problem
from service.model.vocab import TextTokenizer, is_word_level, load_tokenizers

log = logging.getLogger(__name__)


# Engine.encode's signature: each sentence's parts' encoder rows, in order (a caller may pass one
# that also keeps them: service/decode/requests/marked.py's link head reads the decode's rows again)
Encoder = Callable[[Sequence[Prepared]], list[list[EncodedSentence]]]


class Engine:
    """One model version's decoding: its text side (preparation, terms, controls, results) and its
    runtime (encoder, searches). The concepts live in their modules: service/decode/
    preparation.py (a source made ready), terms.py (glossaries and constraints), results.py
    (answers from search results), search.py (the searches a running batch holds)."""

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
        self.preparer = Preparer(bundle, self.src_tok, self.tgt_tok, limits)
        self._device_search_refused: str | None = None  # why this model's search runs on the host
        self.decoding_defaults = check_decoding_defaults(bundle)
        # Align's supervised word aligner, where the bundle ships one (service/decode/runtime/link_head.py)
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
        self.continues_word = continuation_pieces(self.tgt_tok, self.word_level)
        # The standing glossary (service/model/glossary.py): the bundle's, under the server's file
        # for this model (`terms.user_glossary`, --glossary-dir, set and reloaded by the server)
        glossary = bundle.file(bundle.glossary) if bundle.glossary else None
        self.terms = Terms(self.normalize, self.tgt_tok, self.cfg, limits, glossary)
        self.results = Results(
            self.src_tok, self.tgt_tok, self.cfg, self.terms, self.controls, self.min_confidence
        )

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

    def prepare(self, text: str) -> Prepared:
        """Tokenize one source text (Preparer.prepare); empty or over-long input is InvalidInput."""
        return self.preparer.prepare(text)

    def normalize(self, text: str) -> str:
        """The text as this model reads it (Preparer.normalize)."""
        return self.preparer.normalize(text)

    def with_terms(self, sentence: Prepared, options: SearchOptions, where: str) -> Prepared:
        """The sentence with its parts' glossary terms as target tokens, computed once for these
        options (InvalidInput naming `where` for a term it cannot take or a part over the limit):
        what the memory's plan and the controls read."""
        try:
            parts = self.terms.part_constraints(sentence, options)
        except InvalidInput as err:
            raise InvalidInput(f"{where}: {err}") from err
        if max(len(p) for p in parts) > self.limits.max_glossary_terms:
            raise InvalidInput(
                f"{where}: holds more glossary terms than the limit of "
                f"{self.limits.max_glossary_terms} a text may have"
            )
        return replace(sentence, constraints=tuple(parts))

    def translation_of(self, request: DecodeRequest[Any], parts: RawParts) -> Translation:
        """A sentence's search results as its Translation (Results.translation_of)."""
        return self.results.translation_of(request, parts)

    def alignment_mode_for(self, alignment: AlignmentMode) -> AlignmentMode:
        """The matrix an alignment mode gives on this model (word level: its tokens are words)."""
        return self.results.alignment_mode_for(alignment)

    # --- validation -------------------------------------------------------------------------

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
        """Options within this engine's limits (service/decode/shared/options.py's ranges) and an alignment the
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
        self.terms.check(options)
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
            force_eos=options.force_eos,
        )

    def sentence_controls(self, sentence: Prepared, options: SearchOptions) -> list[Controls]:
        """The controls of each part of a sentence (its segments, or itself): a prefix, and
        alternatives after it, belong to the first segment; each part has its own glossary terms
        (the request's target-only ones on the first)."""
        control = self.controls(options)
        out = []
        parts = sentence.constraints
        if parts is None:
            parts = tuple(self.terms.part_constraints(sentence, options))
        for k, constraints in enumerate(parts):
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
        narrow = cfg.toolkit in NARROWING_TOOLKITS  # the toolkit's beam rule
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
        prepared = [
            self.with_terms(self.prepare(t), options.for_text(i), f"texts[{i}]")
            for i, t in enumerate(texts)
        ]
        return self.decode_prepared(prepared, options, alignment, encode)

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
        From token ids rather than texts: a bundle's input rule may refuse any text chosen here.
        At the model's default beam size, which most requests use: the device search makes its
        graphs per beam size, each with a packed copy of the decoder's weights, and keeps them
        (it warmed up at beams 1 and 4: three graphs a model that a beam-5 load never ran)."""
        first = max(self.cfg.pad_id, self.cfg.bos_id, self.cfg.eos_id, self.cfg.unk_id) + 1
        span = max(1, self.cfg.src_vocab_size - first)

        def sentence(n: int) -> Prepared:
            ids = [first + i % span for i in range(n)]
            return Prepared(text="", ids=ids, pieces=self.src_tok.pieces(ids))

        beam = int(self.decoding_defaults.get("beam_size", SearchOptions().beam_size))
        options = SearchOptions(beam_size=beam, max_length_b=4)
        self.decode_prepared([sentence(1)], options, "none")
        alignment: AlignmentMode = "subword" if self.supports_alignment else "none"
        self.decode_prepared([sentence(3), sentence(1)], options, alignment)


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


class RunningBatch(Generic[KeyT]):
    """Sentences decoding together with K hypothesis slots each; sentences join and leave between
    steps. Sentences are known by their requests' keys. A segmented sentence decodes as one search
    entry per segment (keyed (key, k)) and leaves when its last segment finishes, joined.

    The batch holds its searches in order of preference (`Engine.searches`: the device search,
    where the model's graph takes one, then the numpy search, which takes every sentence) and gives
    each sentence to the first that takes its controls (service/decode/search/search.py); a step runs
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
                routed[self.search_for(entry.options, entry.controls)].append(entry)
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

    def search_for(self, options: SearchOptions, controls: Controls) -> int:
        """The first of the batch's searches that takes a sentence with these options and
        controls."""
        return next(i for i, s in enumerate(self.searches) if s.takes(options, controls))

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
