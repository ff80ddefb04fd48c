"""The decoding options, declared once: name, type, default, range and help of each.

`SearchOptions` is the declaration: each of its option fields carries an `OptionSpec` in its
metadata, and everything else is derived from `OPTIONS`, so adding an option touches this module
(and the .proto) only:
- the server's defaults (`Settings.decoding` is a `SearchOptions`; flags `--default-<name>`,
  environment `S2S_DEFAULT_<NAME>`, in service/serve/config.py),
- protobuf parsing and ModelInfo.defaults (service/serve/protocol.py),
- the client's keyword arguments and the CLIs' flags (`add_option_flags`, `options_from_args`).

`problems` is the one validator: SearchOptions runs it when made (static ranges), the server and
the engine run it with the engine's limits (ranges capped by `EngineLimits`), so they cannot
disagree. Each option's name is its DecodingOptions field name, on the wire and in messages.
"""

from __future__ import annotations

import argparse
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from service.model.markup import INVALID_MARKUP, MARKUP_MODES, protect_problem
from service.model.spelling import control_problem


class Limits(Protocol):
    """The engine limits some ranges are capped by (service/serve/config.py's EngineLimits)."""

    @property
    def max_beam_size(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def max_ngram_size(self) -> int: ...

    @property
    def max_alternatives(self) -> int: ...

    @property
    def max_suppress(self) -> int: ...

    @property
    def max_protect(self) -> int: ...

    @property
    def max_glossary_terms(self) -> int: ...


class Terms:
    """The kind of a repeated (source, target) option: the glossary (a message on the wire)."""


TERM_SEPARATOR = "|||"  # the CLIs' "SOURCE ||| TARGET", as the client's Align pairs are written


def parse_term(text: str) -> tuple[str, str]:
    """ "SOURCE ||| TARGET" → (source, target), both stripped; "||| TARGET" is a target-only term."""
    source, separator, target = text.partition(TERM_SEPARATOR)
    if not separator:
        raise argparse.ArgumentTypeError(
            f"a glossary term is 'SOURCE {TERM_SEPARATOR} TARGET' (or '{TERM_SEPARATOR} TARGET'), "
            f"got {text!r}"
        )
    return source.strip(), target.strip()


@dataclass(frozen=True)
class OptionSpec:
    """One decoding option; its name (filled in from the SearchOptions field) is also its
    DecodingOptions field.

    kind is int, float, bool, str (one of `choices`), tuple (of strings: a repeated field) or
    Terms ((source, target) pairs: a repeated message).
    A number must lie in [low, high]; `limit` names the engine limit that caps it further (when
    the limits are known; for a tuple it caps the count), `symmetric` makes the range
    [-limit, limit], and `at_most` names another option it must not exceed.
    """

    kind: type
    default: Any
    help: str
    flags: tuple[str, ...]  # the CLIs' flags, the first one canonical
    low: float = -math.inf
    high: float = math.inf
    limit: str = ""
    symmetric: bool = False
    at_most: str = ""
    choices: tuple[str, ...] = ()
    name: str = ""


STOPPING_RULES: tuple[str, ...] = ("exact", "first", "patience", "narrowing", "heuristic")
# The inexact rules that cut a search short where GNMT's penalties leave the exact bound loose
# (docs/decoding.md#stopping-rules); without a penalty the exact bound is tight.
PENALTY_RULES: tuple[str, ...] = ("first", "patience")
PENALTIES: tuple[str, ...] = ("length_penalty", "coverage_penalty")
MAX_OPTION_TEXT_CHARS = 1000  # the longest target_prefix or suppress entry
SPLIT_MODES: tuple[str, ...] = (
    "off",
    "on",
    "nonewlines",
)  # DeepL's split_sentences 0, 1, nonewlines
MAX_LANGUAGE_CHARS = 32  # the longest target_language name


def option(spec: OptionSpec) -> Any:
    """A SearchOptions field declared by its spec."""
    return field(default=spec.default, metadata={"option": spec})


@dataclass(frozen=True)
class SearchOptions:
    """How one sentence is decoded; checked when made (`problems` without limits).

    The maximum target length (decoder steps) is min(max_length, int(max_length_a * src_len +
    max_length_b)), at least 1. length_penalty is GNMT's α, coverage_penalty GNMT's β.
    """

    beam_size: int = option(
        OptionSpec(int, 5, "beam size (1 = greedy)", ("--beam", "--beam-size"), low=1,
                   limit="max_beam_size")
    )  # fmt: skip
    n_best: int = option(
        OptionSpec(int, 1, "hypotheses returned per text, <= beam size", ("--nbest", "--n-best"),
                   low=1, at_most="beam_size")
    )  # fmt: skip
    max_length_a: float = option(
        OptionSpec(float, 2.0, "max target length = min(max_length, a * |source| + b)",
                   ("--max-length-a", "--max-len-a"), low=0.0, high=100.0)
    )  # fmt: skip
    max_length_b: int = option(
        OptionSpec(int, 10, "b of the maximum length formula", ("--max-length-b", "--max-len-b"),
                   limit="max_length", symmetric=True)
    )  # fmt: skip
    max_length: int = option(
        OptionSpec(int, 256, "hard cap on target tokens", ("--max-length",), low=1,
                   limit="max_length")
    )  # fmt: skip
    length_penalty: float = option(
        OptionSpec(float, 0.0, "GNMT alpha, >= 0", ("--length-penalty",), low=0.0, high=100.0)
    )
    coverage_penalty: float = option(
        OptionSpec(float, 0.0, "GNMT beta, >= 0", ("--coverage-penalty",), low=0.0, high=100.0)
    )
    stopping: str = option(
        OptionSpec(str, "exact", "when a sentence's beam search stops: exact (no live hypothesis "
                   "can still win), first (its best-ranked candidate ended: OpenNMT-py, Joey NMT), "
                   "patience (beam_size x patience hypotheses ended: CTranslate2) or narrowing "
                   "(the beam narrows by each hypothesis that ends, done when beam_size have: "
                   "Marian) or heuristic (beam_size have ended and the best live hypothesis, "
                   "scored at its current length, cannot beat them: transformers' generate)",
                   ("--stopping",), choices=STOPPING_RULES)
    )  # fmt: skip
    normalize: float = option(
        OptionSpec(float, 0.0, "Marian's length normalization: scores divided by length^normalize "
                   "(the end of sentence counted)", ("--normalize",), low=0.0, high=10.0)
    )  # fmt: skip
    word_penalty: float = option(
        OptionSpec(float, 0.0, "Marian's word penalty: subtracted from a score once per token "
                   "(the end of sentence counted)", ("--word-penalty",), low=-100.0, high=100.0)
    )  # fmt: skip
    max_length_factor: float = option(
        OptionSpec(float, 0.0, "Marian's maximum length: ceil(factor x source tokens) target "
                   "tokens (capped by max_length); 0 = max_length_a/b decide",
                   ("--max-length-factor",), low=0.0, high=100.0)
    )  # fmt: skip
    patience: float = option(
        OptionSpec(float, 1.0, "stopping=patience: stop once beam_size x patience hypotheses "
                   "ended", ("--patience",), low=0.01, high=100.0)
    )  # fmt: skip
    no_repeat_ngram_size: int = option(
        OptionSpec(int, 0, "no n-gram of target tokens twice in a hypothesis (0 = off)",
                   ("--no-repeat-ngram-size",), low=0, limit="max_ngram_size")
    )  # fmt: skip
    repetition_penalty: float = option(
        OptionSpec(float, 1.0, "CTRL/CTranslate2 penalty on tokens already generated (> 1 "
                   "penalizes, 1 = off)", ("--repetition-penalty",), low=0.01, high=100.0)
    )  # fmt: skip
    min_length: int = option(
        OptionSpec(int, 0, "end of sentence forbidden before this many target tokens",
                   ("--min-length",), low=0, limit="max_length")
    )  # fmt: skip
    target_prefix: tuple[str, ...] = option(
        OptionSpec(tuple, (), "the start of each text's translation, which the hypotheses "
                   "continue: one per text (or none)", ("--target-prefix",))
    )  # fmt: skip
    return_alternatives: int = option(
        OptionSpec(int, 0, "the k best next words after the prefix, each with its best "
                   "continuation, as the hypotheses (0 = off; <= beam size)",
                   ("--return-alternatives",), low=0, limit="max_alternatives",
                   at_most="beam_size")
    )  # fmt: skip
    sampling_topk: int = option(
        OptionSpec(int, 1, "sample the next token among the k most likely (1 = no sampling: "
                   "beam search; 0 = the whole vocabulary)", ("--sampling-topk",), low=0)
    )  # fmt: skip
    sampling_topp: float = option(
        OptionSpec(float, 1.0, "sampling: among the fewest tokens whose probability reaches p",
                   ("--sampling-topp",), low=0.0, high=1.0)
    )  # fmt: skip
    sampling_temperature: float = option(
        OptionSpec(float, 1.0, "sampling: divide the log-probabilities by this (0 = the most "
                   "likely token)", ("--sampling-temperature",), low=0.0, high=100.0)
    )  # fmt: skip
    seed: int = option(
        OptionSpec(int, 0, "sampling: the random seed (0 = a random one); the same seed gives "
                   "the same answer alone or batched", ("--seed",), low=0, high=2**63 - 1)
    )  # fmt: skip
    force_eos: bool = option(
        OptionSpec(bool, False, "at the maximum length the end of sentence is the only "
                   "candidate and adds nothing to the score: the hypotheses still running end there "
                   "instead of being cut (transformers' forced_eos_token_id)",
                   ("--force-eos",))
    )  # fmt: skip
    replace_unknowns: bool = option(
        OptionSpec(bool, False, "replace each unknown target token by the source word it "
                   "attends to most", ("--replace-unknowns",))
    )  # fmt: skip
    suppress: tuple[str, ...] = option(
        OptionSpec(tuple, (), "words or token sequences never emitted (each tokenized as the "
                   "model's target side)", ("--suppress",), limit="max_suppress")
    )  # fmt: skip
    use_memory: bool = option(
        OptionSpec(bool, True, "answer a text the model's memory knows from the memory "
                   "(docs/memory.md)", ("--use-memory",))
    )  # fmt: skip
    markup: str = option(
        OptionSpec(str, "none", "the texts' inline markup (docs/markup.md): none, xml or html; "
                   "tags are taken out, the plain text translated and each tag put back around "
                   "the words aligned with the words it enclosed", ("--markup",),
                   choices=MARKUP_MODES)
    )  # fmt: skip
    invalid_markup: str = option(
        OptionSpec(str, "refuse", "markup that does not read: refuse (INVALID_ARGUMENT naming "
                   "the position) or text (translate the whole text as plain text)",
                   ("--invalid-markup",), choices=INVALID_MARKUP)
    )  # fmt: skip
    glossary: tuple[tuple[str, str], ...] = option(
        OptionSpec(Terms, (), "terms the translation must use (docs/markup.md): where a source term "
                   "occurs in a text (after the model's input rule) its target term appears in the "
                   f"translation; 'SOURCE {TERM_SEPARATOR} TARGET', or '{TERM_SEPARATOR} TARGET' for "
                   "a target term every translation of the request must contain",
                   ("--glossary",), limit="max_glossary_terms")
    )  # fmt: skip
    use_glossary: bool = option(
        OptionSpec(bool, True, "apply the model's standing glossary (its bundle's and the "
                   "server's --glossary-dir file)", ("--use-glossary",))
    )  # fmt: skip
    protect: tuple[str, ...] = option(
        OptionSpec(tuple, (), "spans never given to the model, put back as written: url, email, "
                   "placeholder ({0} {name} %s %1$d {{ name }}), a delimited span such as ${…}, "
                   "a literal, or none (unset: url, email and placeholder with markup, nothing "
                   "without)", ("--protect",), limit="max_protect")
    )  # fmt: skip
    split_sentences: str = option(
        OptionSpec(str, "off", "cut each text into sentences, each decoded as a sentence of its "
                   "own and the answers joined with the source's whitespace (docs/documents.md): "
                   "off, on (at sentence punctuation and newlines) or nonewlines (at punctuation "
                   "only)", ("--split-sentences",), choices=SPLIT_MODES)
    )  # fmt: skip
    target_language: str = option(
        OptionSpec(str, "", "a multilingual model's target language (one of ModelInfo's "
                   "target_languages, e.g. fra): its >>fra<< token put first in the source",
                   ("--target-language",))
    )  # fmt: skip
    return_attention: bool = False  # not a request option: set by the engine

    def __post_init__(self) -> None:
        found = self.problems()
        if found:
            raise ValueError("invalid search options: " + "; ".join(found))

    def problems(self, limits: Limits | None = None) -> list[str]:
        """Every reason these options are invalid (empty when they are fine)."""
        found = problems(self.values(), limits)
        if not isinstance(self.return_attention, bool):
            found.append(f"return_attention must be a bool, got {self.return_attention!r}")
        return found

    def values(self) -> dict[str, Any]:
        """The request options by name (return_attention left out)."""
        return {spec.name: getattr(self, spec.name) for spec in OPTIONS}

    def max_len(self, src_len: int) -> int:
        """The most decoder steps for a source of src_len tokens: min(max_length, a * src_len + b),
        or with max_length_factor, Marian's ceil(factor * src_len)."""
        if self.max_length_factor > 0:
            return max(1, min(self.max_length, math.ceil(self.max_length_factor * src_len)))
        return max(1, min(self.max_length, int(self.max_length_a * src_len + self.max_length_b)))

    def for_texts(self, indices: Sequence[int]) -> SearchOptions:
        """The options of some of a request's texts, in that order: their own target prefixes."""
        if not self.target_prefix:
            return self
        return replace(self, target_prefix=tuple(self.target_prefix[i] for i in indices))

    @property
    def marked(self) -> bool:
        """Whether texts are read for markup or protected spans (service/model/markup.py)."""
        return self.markup != "none" or (bool(self.protect) and self.protect != ("none",))

    def for_text(self, index: int) -> SearchOptions:
        """The options of the index-th text of a request: its own target prefix only."""
        if not self.target_prefix:
            return self
        return replace(self, target_prefix=(self.target_prefix[index],))


def _specs() -> tuple[OptionSpec, ...]:
    return tuple(
        replace(f.metadata["option"], name=f.name)
        for f in fields(SearchOptions)
        if "option" in f.metadata
    )


OPTIONS: tuple[OptionSpec, ...] = _specs()


def penalized(values: Mapping[str, Any]) -> bool:
    """Whether a length or coverage penalty is in force (an option left out is its default, 0)."""
    return any(values.get(name, 0.0) for name in PENALTIES)


def merge_options(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """A request's options (`given`) over the defaults (the model's over the server's). A default
    stopping rule follows the penalties in force: an inexact rule the defaults pair with a
    penalty ("first", "patience": chosen because the exact bound is loose under penalties) gives
    way to "exact" when the request turns every penalty off and names no rule itself: without a
    penalty the exact bound is tight, and the exact rule gives the exact answer as soon as it is
    known (on John, the same 877 answers as patience's, no slower: docs/decoding.md)."""
    values = {**defaults, **given}
    if (
        "stopping" not in given
        and values.get("stopping") in PENALTY_RULES
        and penalized(defaults)
        and not penalized(values)
    ):
        values["stopping"] = "exact"
    return values


# --- the one validator ---------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _num(x: float) -> str:
    """100.0 → '100', 0.5 → '0.5'."""
    return str(int(x)) if float(x).is_integer() else str(x)


def problem(
    spec: OptionSpec, value: Any, values: Mapping[str, Any], limits: Limits | None
) -> str | None:
    """What is wrong with one option's value (None when nothing is)."""
    if spec.kind is bool:
        return (
            None if isinstance(value, bool) else f"{spec.name} must be true or false, got {value!r}"
        )
    if spec.kind is str:
        if spec.choices and value not in spec.choices:
            return f"{spec.name} must be one of {', '.join(spec.choices)}, got {value!r}"
        if not isinstance(value, str) or len(value) > MAX_LANGUAGE_CHARS:
            return f"{spec.name} must be a string of at most {MAX_LANGUAGE_CHARS} characters"
        return None
    if spec.kind is tuple:
        return _texts_problem(spec, value, limits)
    if spec.kind is Terms:
        return _terms_problem(spec, value, limits)
    low, high = spec.low, spec.high
    if spec.limit and limits is not None:
        high = min(high, getattr(limits, spec.limit))
    if spec.symmetric:
        low = -high
    if spec.kind is float:
        if not _is_number(value) or not low <= value <= high:
            return (
                f"{spec.name} must be a finite number in [{_num(low)}, {_num(high)}], got {value!r}"
            )
        return None
    if not _is_int(value):
        return f"{spec.name} must be an integer, got {value!r}"
    if spec.at_most:
        other: Any = values.get(spec.at_most)
        if _is_int(other) and other >= low and not low <= value <= other:
            return f"{spec.name} ({value}) must be between {_num(low)} and {spec.at_most} ({other})"
    if spec.symmetric and not low <= value <= high:
        return f"{spec.name} must be within ±{_num(high)}, got {value}"
    if not low <= value <= high:
        bound = f">= {_num(low)}" if high == math.inf else f"between {_num(low)} and {_num(high)}"
        return f"{spec.name} must be {bound}, got {value}"
    return None


def _texts_problem(spec: OptionSpec, value: Any, limits: Limits | None) -> str | None:
    """What is wrong with a repeated text option (target_prefix, suppress)."""
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        return f"{spec.name} must be a list of strings, got {value!r}"
    if spec.limit and limits is not None and len(value) > getattr(limits, spec.limit):
        return (
            f"{spec.name} has {len(value)} entries, over the limit of {getattr(limits, spec.limit)}"
        )
    for i, text in enumerate(value):
        if len(text) > MAX_OPTION_TEXT_CHARS:
            return (
                f"{spec.name}[{i}] has {len(text)} characters, over the limit of "
                f"{MAX_OPTION_TEXT_CHARS}"
            )
        if spec.name == "suppress" and not text.strip():
            return f"{spec.name}[{i}] is empty: name a word or token sequence to suppress"
        control = control_problem(text)
        if control is not None:
            return f"{spec.name}[{i}] {control}"
        if spec.name == "protect":
            found = protect_problem(i, text)
            if found:
                return found
    return None


def _terms_problem(spec: OptionSpec, value: Any, limits: Limits | None) -> str | None:
    """What is wrong with the glossary's (source, target) pairs."""
    pairs_ok = isinstance(value, tuple) and all(
        isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, str) for x in v) for v in value
    )
    if not pairs_ok:
        return f"{spec.name} must be a list of (source, target) pairs of strings, got {value!r}"
    if spec.limit and limits is not None and len(value) > getattr(limits, spec.limit):
        return (
            f"{spec.name} has {len(value)} terms, over the limit of {getattr(limits, spec.limit)}"
        )
    for i, (source, target) in enumerate(value):
        if not target.strip():
            return f"{spec.name}[{i}] ({source!r}) has no target term"
        if max(len(source), len(target)) > MAX_OPTION_TEXT_CHARS:
            return f"{spec.name}[{i}] is over {MAX_OPTION_TEXT_CHARS} characters"
        control = control_problem(source) or control_problem(target)
        if control is not None:
            return f"{spec.name}[{i}] {control}"
    return None


def problems(values: Mapping[str, Any], limits: Limits | None = None) -> list[str]:
    """Every reason the option values are invalid, in declaration order; ranges are capped by the
    engine's limits when given."""
    found = (problem(spec, values[spec.name], values, limits) for spec in OPTIONS)
    return [p for p in found if p is not None]


# --- command-line flags --------------------------------------------------------------------------


def add_option_flags(
    parser: argparse.ArgumentParser, defaults: SearchOptions | None, unset: str = "the server's"
) -> None:
    """One flag per option (dest = its name); defaults None leaves unset flags None (whoever
    decodes applies its defaults, named by `unset` in the help), otherwise unset flags take the
    given defaults."""
    group = parser.add_argument_group("decoding options")
    for spec in OPTIONS:
        default = None if defaults is None else getattr(defaults, spec.name)
        shown = unset if defaults is None else "%(default)s"
        text = f"{spec.help.replace('%', '%%')} (default: {shown})"  # argparse formats %
        if spec.kind is bool:
            group.add_argument(
                *spec.flags, dest=spec.name, action=argparse.BooleanOptionalAction,
                default=default, help=text,
            )  # fmt: skip
        elif spec.kind in (tuple, Terms):
            group.add_argument(
                *spec.flags, dest=spec.name, action="append", default=None,
                type=parse_term if spec.kind is Terms else str,
                help=text + "; repeat the flag for more",
            )  # fmt: skip
        else:
            group.add_argument(
                *spec.flags, dest=spec.name, type=spec.kind, default=default,
                choices=spec.choices or None, help=text,
            )  # fmt: skip


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line (None values left out)."""
    given = {
        spec.name: getattr(args, spec.name)
        for spec in OPTIONS
        if getattr(args, spec.name) is not None
    }
    return {name: tuple(v) if isinstance(v, list) else v for name, v in given.items()}
