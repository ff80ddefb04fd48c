"""A model's glossary terms: the standing glossary (the bundle's, under the server's file) and a
request's terms, what a text holds of them as the model reads it, the target token sequences its
translation must contain (lexically constrained beam search: service/decode/shared/constraints.py), and
the report of what became of each term. service/model/glossary.py holds the terms as data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from service.decode.shared import alignment as align
from service.decode.shared.config import EngineLimits
from service.decode.shared.errors import InvalidInput
from service.decode.shared.options import SearchOptions
from service.decode.shared.search_types import Hypothesis
from service.decode.text.preparation import Prepared
from service.decode.text.translation import TranslationHypothesis
from service.model import glossary as gl
from service.model.architecture import ModelConfig
from service.model.vocab import TextTokenizer


def report_order(use: gl.TermUse) -> tuple[bool, int]:
    """A glossary report's order: the request's terms as it sent them, then the model's own."""
    return (use.request_index is None, use.request_index or 0)


class Terms:
    """The glossary side of one model: its standing glossary (`bundle_glossary`, under the server's
    `user_glossary`, set and reloaded by the server) and what a request's terms come to."""

    def __init__(
        self,
        normalize: Callable[[str], str],
        tgt_tok: TextTokenizer,
        cfg: ModelConfig,
        limits: EngineLimits,
        bundle_glossary: Path | None,
    ) -> None:
        """normalize: a text as the model reads it (its input rule)."""
        self.normalize = normalize
        self.tgt_tok = tgt_tok
        self.cfg = cfg
        self.limits = limits
        self._term_tokens: dict[str, tuple[int, ...]] = {}
        self.bundle_glossary = (
            self.read_glossary(bundle_glossary) if bundle_glossary is not None else gl.EMPTY
        )
        self._user_glossary = gl.EMPTY
        self.glossary = self.bundle_glossary  # the terms in force
        self.user_glossary_signature: tuple[str, int, int] | None = None  # its file's

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

    def check(self, options: SearchOptions) -> None:
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
