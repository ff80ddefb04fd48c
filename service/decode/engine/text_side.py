"""A model's text side: what a request needs of its model before and after the decode, and what a
front process holds (no ONNX Runtime session): tokenizers and the input rule (preparation), the
memory, glossary terms and decoding controls as token ids, the options checked against the model,
and answers built from raw search results (`translation_of`). The engine (engine.py) is a text
side with the model's sessions.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from service.decode.runtime.link_head import LinkHead, load_link_head
from service.decode.shared import alignment as align
from service.decode.shared.config import EngineLimits
from service.decode.shared.controls import Controls
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import OPTIONS, SearchOptions
from service.decode.shared.options import problems as option_problems
from service.decode.text.preparation import DecodeRequest, Prepared, Preparer, RawParts
from service.decode.text.results import Results
from service.decode.text.sides import PairReader, pair_ids
from service.decode.text.terms import Terms
from service.decode.text.translation import ALIGNMENT_MODES, AlignmentMode, Translation
from service.model import languages
from service.model import memory as mem
from service.model.bundle import MANIFEST, Bundle, BundleError, load_bundle
from service.model.embedded import resolve_bundle
from service.model.spelling import control_problem, spelling_problem
from service.model.vocab import TextTokenizer, is_word_level, load_tokenizers

log = logging.getLogger(__name__)


class TextSide:
    """One model version's text side (the module docstring). The concepts live in their modules:
    service/decode/text/preparation.py (a source made ready), terms.py (glossaries and
    constraints), results.py (answers from search results)."""

    def __init__(
        self, bundle: Bundle, model: Any, limits: EngineLimits, link_head: LinkHead | None
    ) -> None:
        """`model`: the ONNX Runtime model (an engine's), or what stands in for it in a front (its
        providers and transfer ledger, for ModelInfo and the metrics); `link_head`: the bundle's
        link head (a front's: its thresholds alone)."""
        self.bundle = bundle
        self.model = model
        self.limits = limits
        self.src_tok, self.tgt_tok = load_tokenizers(bundle)
        self.word_level = is_word_level(self.src_tok) and is_word_level(self.tgt_tok)
        self.cfg = bundle.architecture
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
        self.decoding_defaults = check_decoding_defaults(bundle)
        # Align's supervised word aligner, where the bundle ships one (service/decode/runtime/link_head.py)
        self.link_head = link_head
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
    def of_bundle(
        cls, path: str | Path, model: Any, limits: EngineLimits | None = None
    ) -> TextSide:
        """A bundle's text side with no ONNX Runtime session (a front process's): tokenizers, input
        rule, memory, glossary, controls and `translation_of`; `model` stands in for the ONNX
        Runtime model (its providers and transfer ledger, for ModelInfo and the metrics)."""
        bundle = load_bundle(resolve_bundle(path))
        return cls(bundle, model, limits or EngineLimits(), load_link_head(bundle, graph=False))

    @property
    def supports_alignment(self) -> bool:
        return self.cfg.attention != "none"

    @property
    def source_language(self) -> str:
        """The manifest's info.source_language (an ISO 639 code; "" unknown): it picks the
        sentence splitter (service/model/sentences.py)."""
        return str(self.bundle.info.get("source_language", ""))

    @property
    def target_language(self) -> str:
        """The manifest's info.target_language ("" unknown): Align cuts a target with it."""
        return str(self.bundle.info.get("target_language", ""))

    def prepare(self, text: str, target_language: str = "") -> Prepared:
        """Tokenize one source text (Preparer.prepare); empty or over-long input is InvalidInput.
        target_language: a multilingual model's (SearchOptions.target_language), its >>xxx<< token
        read first as if the text began with it; "" for the text's own token, or none."""
        return self.preparer.prepare(text, target_language)

    @property
    def target_languages(self) -> tuple[str, ...]:
        """A multilingual model's target languages (its >>xxx<< tokens' names); () for one."""
        return self.bundle.target_languages

    def leading_language(self, text: str) -> str:
        """The target language whose token a text begins with ("" none): what a text cut into
        sentences asks of all of them."""
        return self.preparer.leading_language(text)

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

    def check_options(
        self, options: SearchOptions, alignment: str, texts: int | None = None
    ) -> None:
        """Options within this engine's limits (service/decode/shared/options.py's ranges) and an alignment the
        model can give; InvalidInput says what to change. texts: how many texts the options are for
        (target_prefix gives one prefix per text, or none)."""
        problems = options.problems(self.limits)
        language = languages.language_problem(
            options.target_language, self.bundle.target_languages, self.bundle.name
        )
        problems += [language] if language else []
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
