"""A source text made ready for the model: validated, read through the bundle's input rule,
tokenized, and cut into segments at the manifest's boundaries (service/model/segment.py), with the
separators between them; and the request a running batch decodes it under. A multilingual model's
source begins with its target language's token (service/model/languages.py), the text's own or the
request's target_language's, before every segment."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from service.decode.shared.config import EngineLimits
from service.decode.shared.controls import Controls
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis
from service.decode.text.translation import AlignmentMode
from service.model import languages, segment
from service.model.bundle import Bundle
from service.model.input_rule import InputRejected
from service.model.vocab import TextTokenizer

MAX_CACHED_SEPARATORS = 256
Constraints = tuple[tuple[int, ...], ...]  # the target token sequences a part must contain


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
    as a sentence of its own, and the separators between them. `constraints`: each part's glossary
    terms as target tokens, once computed for a request's options (Engine.with_terms); None until
    then."""

    text: str
    ids: list[int]  # the source ids the model reads (a segmented input: its segments', in order)
    pieces: list[str]  # the source tokens reported (a segmented input: segments' and separators')
    segments: tuple[Prepared, ...] = ()  # empty: decoded whole
    separators: tuple[Separator, ...] = ()  # len(segments) - 1
    constraints: tuple[Constraints, ...] | None = None  # per part
    # a multilingual model's target language, its >>xxx<< token first in `ids` ("" none)
    language: str = ""

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


class Preparer:
    """One model's source side: its input rule, tokenizers and segmentation."""

    def __init__(
        self, bundle: Bundle, src_tok: TextTokenizer, tgt_tok: TextTokenizer, limits: EngineLimits
    ) -> None:
        self.bundle = bundle
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        self.limits = limits
        self._separators: dict[tuple[str, str], Separator] = {}

    def prepare(self, text: str, target_language: str = "") -> Prepared:
        """Tokenize one source text; empty or over-long input is InvalidInput. A multilingual
        model's target language (`language_of`) is read as its token first: the text's own, or
        target_language's as if the text began with it."""
        if not isinstance(text, str):
            raise InvalidInput(f"text must be a string, got {type(text).__name__}")
        if not text.strip():
            raise InvalidInput(
                "text is empty or only whitespace: send at least one word to translate"
            )
        language, rest, typed = self.language_of(text, target_language)
        if language and not rest.strip():
            raise InvalidInput(
                f"text holds only its {languages.token(language)} token: send at least one word "
                "to translate"
            )
        source = self.normalize(rest)
        # the token, then the text as typed after it (MarianTokenizer's), or a space after one the
        # request's target_language puts first
        prefix = languages.token(language) + ("" if typed else " ") if language else ""
        ids = self.src_tok.encode(prefix + source)
        if not ids:
            raise InvalidInput("text has no translatable content after tokenization")
        if len(ids) > self.limits.max_source_tokens:  # the whole input's, segmented or not
            raise InvalidInput(
                f"text is {len(ids)} subword tokens long, over the limit of {self.limits.max_source_tokens}: "
                "split it into shorter sentences"
            )
        pieces = self.src_tok.pieces(ids, prefix + source)
        whole = Prepared(text=text, ids=ids, pieces=pieces, language=language)
        if self.bundle.segmentation is None:
            return whole
        return self.segmented(whole, source, prefix)

    def language_of(self, text: str, target_language: str = "") -> tuple[str, str, bool]:
        """The target language a source asks for ("" none), the text after its token, and whether
        the token was the text's own: the >>xxx<< token a multilingual model's source begins with,
        else target_language. InvalidInput for a language the model lacks (a model with one
        target language takes none), or a text's token and a target_language that differ."""
        known = self.bundle.target_languages
        found = languages.leading(text) if known else None
        if found is None:
            problem = languages.language_problem(target_language, known, self.bundle.name)
            if problem is not None:
                raise InvalidInput(problem)
            return target_language, text, False
        name, rest = found
        if name not in known:
            raise InvalidInput(
                f"text begins with {languages.token(name)}, which is not one of this model's "
                f"target languages: {', '.join(known)}"
            )
        if target_language and target_language != name:
            raise InvalidInput(
                f"text begins with {languages.token(name)} but target_language is "
                f"{target_language!r}: give one of them, or the same"
            )
        return name, rest, True

    def leading_language(self, text: str) -> str:
        """The name of the model's target-language token a text begins with ("" none)."""
        found = languages.leading(text) if self.bundle.target_languages else None
        return found[0] if found is not None and found[0] in self.bundle.target_languages else ""

    def normalize(self, text: str) -> str:
        """The text as this model reads it: after the bundle's input rule (its declared case,
        alphabet and length; InvalidInput when the rule refuses it), as is without one."""
        if self.bundle.input_rule is None:
            return text
        try:
            return self.bundle.input_rule.apply(text)
        except InputRejected as err:
            raise InvalidInput(str(err)) from err

    def segmented(self, whole: Prepared, source: str, prefix: str = "") -> Prepared:
        """`whole` cut at the bundle's boundaries (service/model/segment.py); itself when there are
        none. prefix: a target language's token, read before every segment."""
        assert self.bundle.segmentation is not None
        split = self.bundle.segmentation.split(source)
        if len(split.segments) < 2:
            return whole
        segments = []
        for text in split.segments:
            ids = self.src_tok.encode(text)
            if not ids:  # a segment with nothing to read: decode the input whole instead
                return whole
            if prefix:
                ids = self.src_tok.encode(prefix + text)
            pieces = self.src_tok.pieces(ids, prefix + text)
            segments.append(Prepared(text=text, ids=ids, pieces=pieces, language=whole.language))
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
            language=whole.language,
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
