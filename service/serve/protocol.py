"""Protobuf ↔ plain types, for the server and the client: the only module that builds or reads
translation.v1 messages.

Server side: a TranslateRequest is validated against the limits and becomes texts,
`SearchOptions` and an alignment mode; `Translation`s become protobuf; ModelInfo is built from the
settings. Client side: keyword options become DecodingOptions; responses become `Client*`
dataclasses with numpy alignment matrices. The decoding options are service/decode/shared/options.py's: each
option's name is its DecodingOptions field, so both directions loop over `OPTIONS`. How large a
response can grow, checked before decoding, is service/serve/response_bound.py's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from proto.translation.v1 import translation_pb2 as pb
from service.decode.align.forced import AlignedPair, AlignOptions, Matrices, default_links
from service.decode.align.links import DEFAULT_THRESHOLD
from service.decode.shared.alignment import Alignment
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import (
    OPTIONS,
    TERM_SEPARATOR,
    SearchOptions,
    Terms,
    merge_options,
    problems,
)
from service.model import glossary as gl

if TYPE_CHECKING:  # the client imports this module: keep onnxruntime out of its imports
    from service.decode.engine.text_side import TextSide
    from service.decode.text.translation import AlignmentMode, Translation
    from service.serve.config import Settings
    from service.serve.repository import ModelVersion

ALIGNMENT_FROM_PB: dict[int, AlignmentMode] = {
    pb.ALIGNMENT_MODE_UNSPECIFIED: "none",
    pb.ALIGNMENT_MODE_NONE: "none",
    pb.ALIGNMENT_MODE_SUBWORD: "subword",
    pb.ALIGNMENT_MODE_WORD: "word",
}
ALIGNMENT_MODES: dict[str, pb.AlignmentMode] = {
    "none": pb.ALIGNMENT_MODE_NONE,
    "subword": pb.ALIGNMENT_MODE_SUBWORD,
    "word": pb.ALIGNMENT_MODE_WORD,
}

LINKS_FROM_PB: dict[int, str | None] = {
    pb.LINK_MODE_UNSPECIFIED: None,  # the server's default
    pb.LINK_MODE_ARGMAX: "argmax",
    pb.LINK_MODE_SOURCE_ARGMAX: "source_argmax",
    pb.LINK_MODE_INTERSECT: "intersect",
    pb.LINK_MODE_UNION: "union",
    pb.LINK_MODE_GROW: "grow",
    pb.LINK_MODE_THRESHOLD: "threshold",
    pb.LINK_MODE_HEAD: "head",
}
LINK_MODES_PB: dict[str, int] = {name: v for v, name in LINKS_FROM_PB.items() if name}
MATRICES_FROM_PB: dict[int, Matrices] = {
    pb.ALIGNMENT_MODE_UNSPECIFIED: "both",
    pb.ALIGNMENT_MODE_NONE: "none",
    pb.ALIGNMENT_MODE_SUBWORD: "subword",
    pb.ALIGNMENT_MODE_WORD: "word",
}
MATRICES_PB: dict[str, int] = {name: v for v, name in MATRICES_FROM_PB.items()}

# A request_id is echoed back and written in every log line of its request: bounded.
MAX_REQUEST_ID_CHARS = 128


# --- server side: requests in ------------------------------------------------------------------


class MalformedRequest:
    """Request bytes that are not a TranslateRequest (bad wire format, a string that is not UTF-8).

    grpc would answer such bytes itself, UNKNOWN with the parser's exception and unseen by the
    metrics; the servicer gets this instead and answers INVALID_ARGUMENT like any other bad input.
    """

    texts: tuple[str, ...] = ()
    request_id = ""
    model = pb.ModelSpec()  # the default model: its metrics label the refusal

    def __init__(self, error: str) -> None:
        self.error = error


def deserialize_translate_request(data: bytes) -> pb.TranslateRequest | MalformedRequest:
    try:
        return pb.TranslateRequest.FromString(data)
    except DecodeError as err:
        return MalformedRequest(str(err))


def deserialize_align_request(data: bytes) -> pb.AlignRequest | MalformedRequest:
    try:
        return pb.AlignRequest.FromString(data)
    except DecodeError as err:
        return MalformedRequest(str(err))


@dataclass(frozen=True)
class ParsedRequest:
    texts: list[str]
    options: SearchOptions
    alignment: AlignmentMode


def parse_request(
    request: pb.TranslateRequest,
    settings: Settings,
    model_defaults: Mapping[str, Any] | None = None,
) -> ParsedRequest:
    """Validate a TranslateRequest against the limits; InvalidInput says what to change. Options
    the request leaves unset take the model's defaults (its manifest's "decoding"), then the
    server's."""
    server = settings.server
    texts = list(request.texts)
    if not texts:
        raise InvalidInput("texts is empty: send at least one text to translate")
    if len(texts) > server.max_texts:
        raise InvalidInput(
            f"{len(texts)} texts in one request, over the limit of {server.max_texts}: split the request"
        )
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidInput(
            f"request_id has {len(request.request_id)} characters, over the limit of "
            f"{MAX_REQUEST_ID_CHARS}: send a shorter id (or none: the server makes one)"
        )
    options = parse_options(request.options, settings, model_defaults)
    documents = options.split_sentences != "off"
    limit = server.max_document_chars if documents else server.max_text_chars
    for i, text in enumerate(texts):
        if not text.strip():
            raise InvalidInput(f"texts[{i}] is empty or only whitespace")
        if len(text) > limit:
            hint = (
                "" if documents else
                f"; a text cut into sentences (split_sentences on) may hold {server.max_document_chars}"
            )  # fmt: skip
            raise InvalidInput(
                f"texts[{i}] has {len(text)} characters, over the limit of {limit}{hint}"
            )
    return ParsedRequest(texts, options, parse_alignment(request.options.alignment))


def default_options(
    settings: Settings, model_defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a request gets for each option it leaves unset: the model's defaults, else the
    configured ones; max_length capped by the engine's limit."""
    defaults = {**settings.decoding.values(), **(model_defaults or {})}
    defaults["max_length"] = min(defaults["max_length"], settings.limits.max_length)
    return defaults


def parse_options(
    o: pb.DecodingOptions, settings: Settings, model_defaults: Mapping[str, Any] | None = None
) -> SearchOptions:
    """The set fields of DecodingOptions over the defaults (service/decode/shared/options.py's
    merge_options: a default stopping rule follows the penalties in force), checked against the
    engine's limits. Cached by the message's bytes: clients send the same options again and
    again, and checking every option is a tenth of a front's work on a request."""
    defaults = tuple(sorted((model_defaults or {}).items()))
    try:
        return _parse_cached(o.SerializeToString(deterministic=True), settings, defaults)
    except TypeError:  # a default that is not hashable: parse it here
        return _parse_options(o, settings, model_defaults)


@functools.lru_cache(maxsize=1024)
def _parse_cached(
    data: bytes, settings: Settings, defaults: tuple[tuple[str, Any], ...]
) -> SearchOptions:
    return _parse_options(pb.DecodingOptions.FromString(data), settings, dict(defaults))


def _parse_options(
    o: pb.DecodingOptions, settings: Settings, model_defaults: Mapping[str, Any] | None = None
) -> SearchOptions:
    given: dict[str, Any] = {}
    for spec in OPTIONS:
        if spec.kind is tuple:  # a repeated field: empty is unset
            if getattr(o, spec.name):
                given[spec.name] = tuple(getattr(o, spec.name))
        elif spec.kind is Terms:  # repeated GlossaryTerm
            if getattr(o, spec.name):
                given[spec.name] = tuple((t.source, t.target) for t in getattr(o, spec.name))
        elif o.HasField(spec.name):
            given[spec.name] = spec.kind(getattr(o, spec.name))
    values = merge_options(default_options(settings, model_defaults), given)
    found = problems(values, settings.limits)
    if found:
        raise InvalidInput("; ".join(found))
    return SearchOptions(**values)


def parse_alignment(value: int) -> AlignmentMode:
    if value not in ALIGNMENT_FROM_PB:
        raise InvalidInput(f"unknown alignment mode {value}: use NONE, SUBWORD or WORD")
    return ALIGNMENT_FROM_PB[value]


@dataclass(frozen=True)
class ParsedAlign:
    pairs: list[tuple[str, str]]  # (source, target)
    options: AlignOptions


def check_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidInput(
            f"request_id has {len(request_id)} characters, over the limit of "
            f"{MAX_REQUEST_ID_CHARS}: send a shorter id (or none: the server makes one)"
        )


def parse_align_request(request: pb.AlignRequest, settings: Settings) -> ParsedAlign:
    """Validate an AlignRequest against the limits (pairs as texts: max_texts pairs, max_text_chars
    per side); InvalidInput names the pair and says what to change."""
    server = settings.server
    pairs = [(p.source, p.target) for p in request.pairs]
    if not pairs:
        raise InvalidInput("pairs is empty: send at least one (source, target) pair to align")
    if len(pairs) > server.max_texts:
        raise InvalidInput(
            f"{len(pairs)} pairs in one request, over the limit of {server.max_texts}: split the request"
        )
    check_request_id(request.request_id)
    for i, pair in enumerate(pairs):
        for side, text in zip(("source", "target"), pair, strict=True):
            if not text.strip():
                raise InvalidInput(f"pairs[{i}].{side} is empty or only whitespace")
            if len(text) > server.max_text_chars:
                raise InvalidInput(
                    f"pairs[{i}].{side} has {len(text)} characters, over the limit of "
                    f"{server.max_text_chars}"
                )
    o = request.options
    if o.links not in LINKS_FROM_PB:
        raise InvalidInput(f"unknown link mode {o.links}: use one of {sorted(LINK_MODES_PB)}")
    if o.alignment not in MATRICES_FROM_PB:
        raise InvalidInput(f"unknown alignment mode {o.alignment}: use NONE, SUBWORD or WORD")
    options = AlignOptions(
        links=LINKS_FROM_PB[o.links] or "",  # "": the model's default (pair_answers.resolve_links)
        threshold=o.threshold if o.HasField("threshold") else DEFAULT_THRESHOLD,
        matrices=MATRICES_FROM_PB[o.alignment],
        markup=o.markup if o.HasField("markup") else "none",
        invalid_markup=o.invalid_markup if o.HasField("invalid_markup") else "refuse",
        attention_layer=o.attention_layer if o.HasField("attention_layer") else None,
        attention_head=o.attention_head if o.HasField("attention_head") else None,
    )
    found = options.problems()
    if found:
        raise InvalidInput("; ".join(found))
    return ParsedAlign(pairs, options)


# --- server side: results out ------------------------------------------------------------------


WEIGHTS_TAG = bytes(
    [pb.Alignment.WEIGHTS_FIELD_NUMBER << 3 | 2]
)  # a packed field: length-delimited


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def packed_weights(matrix: np.ndarray) -> bytes:
    """The `weights` field's encoding, straight from the matrix's bytes: a packed repeated float
    is its little-endian float32 values, so no float becomes a Python object on the way."""
    data = np.ascontiguousarray(matrix, dtype="<f4").tobytes()  # (rows * cols,)
    return WEIGHTS_TAG + varint(len(data)) + data


def alignment_to_pb(a: Alignment) -> pb.Alignment:
    matrix = np.asarray(a.matrix)  # (rows, cols)
    rows, cols = matrix.shape
    out = pb.Alignment(
        rows=rows,
        cols=cols,
        source_tokens=a.source_tokens,
        target_tokens=a.target_tokens,
        pharaoh=a.pharaoh,
        unknown_target_tokens=a.unknown_target_tokens,
    )
    if rows * cols:
        out.MergeFromString(packed_weights(matrix))
    return out


def aligned_pair_to_pb(a: AlignedPair) -> pb.PairAlignment:
    out = pb.PairAlignment(
        source_tokens=a.source_tokens,
        target_tokens=a.target_tokens,
        source_words=a.source_words,
        target_words=a.target_words,
        pharaoh=a.pharaoh,
        token_log_probs=a.token_log_probs,
        eos_log_prob=a.eos_log_prob,
        log_prob=a.log_prob,
        confidence=a.confidence,
        unknown_source_tokens=a.unknown_source_tokens,
        unknown_target_tokens=a.unknown_target_tokens,
        unknown_source_words=a.unknown_source_words,
        unknown_target_words=a.unknown_target_words,
        tagged_target=a.tagged_target,
    )
    if a.subword is not None:
        out.subword.CopyFrom(alignment_to_pb(a.subword))
    if a.word is not None:
        out.word.CopyFrom(alignment_to_pb(a.word))
    return out


ORIGINS = {"model": pb.ORIGIN_MODEL, "memory": pb.ORIGIN_MEMORY, "mixed": pb.ORIGIN_MIXED}
TERM_STATUSES = {
    gl.KEPT: pb.TERM_STATUS_KEPT,
    gl.OVERLAPPED: pb.TERM_STATUS_OVERLAPPED,
    gl.CUT: pb.TERM_STATUS_CUT,
}


def term_use_to_pb(use: gl.TermUse) -> pb.GlossaryTermResult:
    out = pb.GlossaryTermResult(
        term=pb.GlossaryTerm(source=use.term.source, target=use.term.target),
        status=TERM_STATUSES[use.status],  # type: ignore[arg-type]
    )
    if use.request_index is not None:
        out.request_index = use.request_index
    if use.kept_instead is not None:
        out.kept_instead.CopyFrom(
            pb.GlossaryTerm(source=use.kept_instead.source, target=use.kept_instead.target)
        )
    return out


def translation_to_pb(t: Translation) -> pb.Translation:
    out = pb.Translation(
        source_tokens=t.source_tokens,
        glossary=[term_use_to_pb(u) for u in t.glossary],
        sentence_spans=[pb.Span(start=a, end=b) for a, b in t.sentence_spans],
    )
    for h in t.hypotheses:
        hyp = out.hypotheses.add(
            text=h.text,
            tokens=h.tokens,
            score=h.score,
            log_prob=h.log_prob,
            finished=h.finished,
            confidence=h.confidence,
            low_confidence=h.low_confidence,
            token_log_probs=h.token_log_probs,
            replaced_unknowns=h.replaced_unknowns,
            origin=ORIGINS[h.origin],
            plain_text=h.plain_text,
            unknown_tokens=h.unknown_tokens,
            sentence_spans=[pb.Span(start=a, end=b) for a, b in h.sentence_spans],
            sentence_scores=h.sentence_scores,
            sentence_confidences=h.sentence_confidences,
        )
        if h.alignment is not None:
            hyp.alignment.CopyFrom(alignment_to_pb(h.alignment))
        if h.alternative is not None:
            a = h.alternative
            hyp.alternative.CopyFrom(
                pb.Alternative(word=a.word, probability=a.probability, position=a.position)
            )
    return out


def model_info(model: ModelVersion, settings: Settings, is_default: bool = False) -> pb.ModelInfo:
    limits = settings.limits
    engine = model.engine
    return pb.ModelInfo(
        name=model.name,
        version=model.version,
        architecture_json=json.dumps(engine.cfg.to_dict(), sort_keys=True),
        limits=pb.Limits(
            max_texts=settings.server.max_texts,
            max_text_chars=settings.server.max_text_chars,
            max_sentences=settings.server.max_sentences,
            max_document_chars=settings.server.max_document_chars,
            max_source_tokens=limits.max_source_tokens,
            max_beam_size=limits.max_beam_size,
            max_length=limits.max_length,
            max_message_bytes=settings.server.max_message_bytes,
            max_request_id_chars=MAX_REQUEST_ID_CHARS,
            max_prefix_tokens=limits.max_prefix_tokens,
            max_ngram_size=limits.max_ngram_size,
            max_alternatives=limits.max_alternatives,
            max_suppress=limits.max_suppress,
            max_protect=limits.max_protect,
            max_glossary_terms=limits.max_glossary_terms,
            max_term_tokens=limits.max_term_tokens,
        ),
        defaults=pb.DecodingOptions(
            **default_options(settings, engine.decoding_defaults),
            alignment=pb.ALIGNMENT_MODE_NONE,
        ),
        execution_providers=engine.model.providers,
        scheduling_policy=settings.batching.policy,
        is_default=is_default,
        resident_memory_bytes=model.resident_bytes,
        confidence_threshold=engine.min_confidence,
        segmentation=engine.bundle.segmentation is not None,
        description=model_description(engine.bundle.info),
        default_link_mode=default_link_mode(engine),  # type: ignore[arg-type]
        links_source=links_source(engine.bundle.info) if engine.link_head is not None else "",
        glossary_terms=len(engine.terms.glossary),
        source_language=engine.source_language,
        target_languages=engine.target_languages,
    )


def links_source(info: dict[str, Any]) -> str:
    """The teacher of the link head's links, from the manifest's info.link_head.links_source
    (export/train/teacher.py); "gold" for heads trained before it was recorded (all on gold)."""
    source = info.get("link_head", {}).get("links_source", {})
    teacher = source.get("teacher") if isinstance(source, dict) else None
    return teacher if isinstance(teacher, str) and teacher else "gold"


def model_description(info: dict[str, Any]) -> str:
    """The manifest's info.description, else info.task (older bundles), else ""."""
    for key in ("description", "task"):
        if isinstance(info.get(key), str) and info[key].strip():
            return str(info[key]).strip()
    return ""


# --- client side -------------------------------------------------------------------------------


ClientAlignment = Alignment  # the engine's own type: matrix (rows, cols) float32


@dataclass(frozen=True)
class ClientHypothesis:
    text: str
    tokens: list[str]
    score: float  # normalized score that ranks the n-best list
    log_prob: float  # sum of token log-probabilities
    finished: bool  # False when cut at the maximum length
    alignment: ClientAlignment | None  # None unless asked for (and the model has attention)
    confidence: float = 0.0  # geometric-mean token probability in [0, 1] (the server's)
    low_confidence: bool = False  # below the server's threshold (ModelInfo.confidence_threshold)
    token_log_probs: tuple[float, ...] = ()  # log P of each token (the end of sentence not listed)
    alternative: ClientAlternative | None = None  # with return_alternatives
    replaced_unknowns: tuple[int, ...] = ()  # tokens replaced by a source word (replace_unknowns)
    origin: str = "model"  # "memory": the model's memory answered it
    plain_text: str = ""  # with markup: the translation without it (`text` has the markup)
    unknown_tokens: tuple[int, ...] = ()  # a memory's target: tokens the vocabulary cannot spell
    # a text cut into sentences: each sentence's place in plain_text (else text), score, confidence
    sentence_spans: tuple[tuple[int, int], ...] = ()
    sentence_scores: tuple[float, ...] = ()
    sentence_confidences: tuple[float, ...] = ()


@dataclass(frozen=True)
class ClientAlternative:
    word: str  # the word the hypothesis puts first after the prefix
    probability: float  # its probability there
    position: int  # the token index where it starts


@dataclass(frozen=True)
class ClientTranslation:
    source: str  # the text sent
    source_tokens: list[str]
    hypotheses: list[ClientHypothesis]  # best first
    glossary: tuple[
        gl.TermUse, ...
    ] = ()  # the terms that apply to the text, and what became of each
    sentence_spans: tuple[tuple[int, int], ...] = ()  # a text cut into sentences: each one's place

    @property
    def best(self) -> ClientHypothesis:
        return self.hypotheses[0]


def decoding_options_to_pb(alignment: str = "none", **options: Any) -> pb.DecodingOptions:
    """DecodingOptions with only the given options set (unset or None = the server's default).

    The keyword arguments are service/decode/shared/options.py's option names (beam_size, n_best, max_length,
    max_length_a, max_length_b, length_penalty, coverage_penalty).
    """
    if alignment not in ALIGNMENT_MODES:
        raise ValueError(f"alignment must be one of {tuple(ALIGNMENT_MODES)}, got {alignment!r}")
    kinds = {spec.name: spec.kind for spec in OPTIONS}
    unknown = sorted(set(options) - set(kinds))
    if unknown:
        raise TypeError(f"unknown decoding options {unknown}: the options are {sorted(kinds)}")
    message = pb.DecodingOptions(alignment=ALIGNMENT_MODES[alignment])
    for name, value in options.items():
        if value is None:
            continue
        if kinds[name] is tuple:  # a repeated field (target_prefix, suppress)
            if isinstance(value, str):
                raise TypeError(f"{name} takes a list of strings, got a string")
            getattr(message, name).extend(value)
        elif kinds[name] is Terms:  # (source, target) pairs, or "SOURCE ||| TARGET" strings
            getattr(message, name).extend(glossary_term(term) for term in value)
        else:
            setattr(message, name, value)
    return message


def glossary_term(term: Any) -> pb.GlossaryTerm:
    """A glossary term from a (source, target) pair, a {"source", "target"} dict or a
    "SOURCE ||| TARGET" string."""
    if isinstance(term, str):
        source, separator, target = term.partition(TERM_SEPARATOR)
        if not separator:
            raise ValueError(
                f"a glossary term string is 'SOURCE {TERM_SEPARATOR} TARGET', got {term!r}"
            )
        return pb.GlossaryTerm(source=source.strip(), target=target.strip())
    if isinstance(term, dict):
        return pb.GlossaryTerm(source=term.get("source", ""), target=term.get("target", ""))
    source, target = term
    return pb.GlossaryTerm(source=source, target=target)


def alignment_from_pb(message: pb.Alignment) -> ClientAlignment | None:
    """The packed row-major weights as a (rows, cols) matrix; None for an empty alignment."""
    rows, cols = message.rows, message.cols
    if rows == 0 or cols == 0:
        return None
    if len(message.weights) != rows * cols:
        raise ValueError(f"alignment has {len(message.weights)} weights, expected {rows} x {cols}")
    matrix = np.asarray(message.weights, dtype=np.float32).reshape(rows, cols)  # (rows, cols)
    return ClientAlignment(
        matrix=matrix,
        source_tokens=list(message.source_tokens),
        target_tokens=list(message.target_tokens),
        pharaoh=message.pharaoh,
        unknown_target_tokens=tuple(message.unknown_target_tokens),
    )


def hypothesis_from_pb(message: pb.Hypothesis) -> ClientHypothesis:
    alignment = alignment_from_pb(message.alignment) if message.HasField("alignment") else None
    return ClientHypothesis(
        text=message.text,
        tokens=list(message.tokens),
        score=message.score,
        log_prob=message.log_prob,
        finished=message.finished,
        alignment=alignment,
        confidence=message.confidence,
        low_confidence=message.low_confidence,
        token_log_probs=tuple(message.token_log_probs),
        alternative=ClientAlternative(
            message.alternative.word, message.alternative.probability, message.alternative.position
        )
        if message.HasField("alternative")
        else None,
        replaced_unknowns=tuple(message.replaced_unknowns),
        origin={v: k for k, v in ORIGINS.items()}.get(message.origin, "model"),
        plain_text=message.plain_text,
        unknown_tokens=tuple(message.unknown_tokens),
        sentence_spans=tuple((s.start, s.end) for s in message.sentence_spans),
        sentence_scores=tuple(message.sentence_scores),
        sentence_confidences=tuple(message.sentence_confidences),
    )


def term_use_from_pb(message: pb.GlossaryTermResult) -> gl.TermUse:
    statuses = {v: k for k, v in TERM_STATUSES.items()}
    instead = message.kept_instead if message.HasField("kept_instead") else None
    return gl.TermUse(
        term=gl.Term(message.term.source, message.term.target),
        status=statuses.get(message.status, gl.KEPT),
        request_index=message.request_index if message.HasField("request_index") else None,
        kept_instead=None if instead is None else gl.Term(instead.source, instead.target),
    )


def translation_from_pb(message: pb.Translation, source: str = "") -> ClientTranslation:
    return ClientTranslation(
        source=source,
        source_tokens=list(message.source_tokens),
        hypotheses=[hypothesis_from_pb(h) for h in message.hypotheses],
        glossary=tuple(term_use_from_pb(u) for u in message.glossary),
        sentence_spans=tuple((s.start, s.end) for s in message.sentence_spans),
    )


def align_options_to_pb(
    links: str | None = None,
    threshold: float | None = None,
    matrices: str = "both",
    markup: str | None = None,
    invalid_markup: str | None = None,
    attention_layer: int | None = None,
    attention_head: int | None = None,
) -> pb.AlignOptions:
    """AlignOptions: links one of service/decode/align/links.py's LINK_MODES (None: the server's
    default), matrices one of both, none, subword, word; markup none, xml or html (None: none);
    a Transformer's attention layer and head (None: the model's)."""
    if links is not None and links not in LINK_MODES_PB:
        raise ValueError(f"links must be one of {tuple(LINK_MODES_PB)}, got {links!r}")
    if matrices not in MATRICES_PB:
        raise ValueError(f"matrices must be one of {tuple(MATRICES_PB)}, got {matrices!r}")
    message = pb.AlignOptions(alignment=MATRICES_PB[matrices])  # type: ignore[arg-type]
    if links is not None:
        message.links = LINK_MODES_PB[links]  # type: ignore[assignment]
    if threshold is not None:
        message.threshold = threshold
    if markup is not None:
        message.markup = markup
    if invalid_markup is not None:
        message.invalid_markup = invalid_markup
    if attention_layer is not None:
        message.attention_layer = attention_layer
    if attention_head is not None:
        message.attention_head = attention_head
    return message


def aligned_pair_from_pb(message: pb.PairAlignment) -> AlignedPair:
    """The client's view of one pair: the engine's own AlignedPair type, matrices as numpy."""
    subword = alignment_from_pb(message.subword) if message.HasField("subword") else None
    word = alignment_from_pb(message.word) if message.HasField("word") else None
    return AlignedPair(
        source_tokens=list(message.source_tokens),
        target_tokens=list(message.target_tokens),
        source_words=list(message.source_words),
        target_words=list(message.target_words),
        subword=subword,
        word=word,
        pharaoh=message.pharaoh,
        token_log_probs=list(message.token_log_probs),
        eos_log_prob=message.eos_log_prob,
        log_prob=message.log_prob,
        confidence=message.confidence,
        unknown_source_tokens=list(message.unknown_source_tokens),
        unknown_target_tokens=list(message.unknown_target_tokens),
        unknown_source_words=list(message.unknown_source_words),
        unknown_target_words=list(message.unknown_target_words),
        tagged_target=message.tagged_target,
    )


def default_link_mode(engine: TextSide) -> int:
    """The LinkMode an Align request without one gets from this model."""
    if not engine.supports_alignment:
        return pb.LINK_MODE_UNSPECIFIED
    return LINK_MODES_PB[default_links(engine.link_head is not None)]


def model_info_from_pb(message: pb.ModelInfo) -> dict[str, Any]:
    """ModelInfo as a dict with proto field names; `architecture_json` also parsed as `architecture`."""
    info = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    if message.architecture_json:
        info["architecture"] = json.loads(message.architecture_json)
    return info
