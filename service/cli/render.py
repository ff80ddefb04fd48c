"""Translations as JSON, one shape for every CLI: the engine's `Translation` (translate CLI) and the
client's `ClientTranslation` (client CLI) carry the same fields, so one function serves both."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

DECIMALS = 4  # attention weights and scores: enough to read and plot, short in JSON


def alignment_to_json(a: Any) -> dict[str, Any] | None:
    if a is None:
        return None
    return {
        "source_tokens": list(a.source_tokens),
        "target_tokens": list(a.target_tokens),
        # float64 before rounding: a rounded float32 prints as 0.12340000271797180
        "matrix": np.asarray(a.matrix, dtype=np.float64).round(DECIMALS).tolist(),
        "pharaoh": a.pharaoh,
        **(
            {"unknown_target_tokens": list(a.unknown_target_tokens)}
            if getattr(a, "unknown_target_tokens", ())
            else {}
        ),
    }


def term_use_to_json(use: Any) -> dict[str, Any]:
    """A glossary term that applies to a text, and what became of it (service/model/glossary.py's
    TermUse): its request index where the request sent it, the term kept over an overlapped one."""
    out: dict[str, Any] = {
        "source": use.term.source,
        "target": use.term.target,
        "status": use.status,
    }
    if use.request_index is not None:
        out["request_index"] = use.request_index
    if use.kept_instead is not None:
        out["kept_instead"] = {"source": use.kept_instead.source, "target": use.kept_instead.target}
    return out


def translation_to_json(t: Any) -> dict[str, Any]:
    """A JSON-ready dict; matrices as nested lists, floats rounded to DECIMALS places; the glossary
    terms that apply to the text, where there are any."""
    glossary = [term_use_to_json(u) for u in getattr(t, "glossary", ())]
    spans = getattr(t, "sentence_spans", ())
    return {
        "source": t.source,
        "source_tokens": list(t.source_tokens),
        **({"glossary": glossary} if glossary else {}),
        **({"sentence_spans": [list(s) for s in spans]} if spans else {}),
        "hypotheses": [
            {
                "text": h.text,
                "tokens": list(h.tokens),
                "score": round(float(h.score), DECIMALS),
                "log_prob": round(float(h.log_prob), DECIMALS),
                "finished": h.finished,
                "confidence": round(float(h.confidence), DECIMALS),
                "low_confidence": bool(h.low_confidence),
                "alignment": alignment_to_json(h.alignment),
                "token_log_probs": [round(float(x), DECIMALS) for x in h.token_log_probs],
                "origin": h.origin,
                **alternative_to_json(h),
            }
            for h in t.hypotheses
        ],
    }


def alternative_to_json(h: Any) -> dict[str, Any]:
    """A hypothesis's return_alternatives word, replace_unknowns tokens, the plain text of a
    marked-up answer and a memory target's unknown tokens, where it has them."""
    out: dict[str, Any] = {}
    if h.alternative is not None:
        a = h.alternative
        out["alternative"] = {
            "word": a.word,
            "probability": round(float(a.probability), DECIMALS),
            "position": a.position,
        }
    if h.replaced_unknowns:
        out["replaced_unknowns"] = list(h.replaced_unknowns)
    if getattr(h, "unknown_tokens", ()):
        out["unknown_tokens"] = list(h.unknown_tokens)
    if getattr(h, "plain_text", ""):
        out["plain_text"] = h.plain_text
    if getattr(h, "sentence_spans", ()):  # a text cut into sentences (docs/documents.md)
        out["sentence_spans"] = [list(span) for span in h.sentence_spans]
        out["sentence_scores"] = [round(float(x), DECIMALS) for x in h.sentence_scores]
        out["sentence_confidences"] = [round(float(x), DECIMALS) for x in h.sentence_confidences]
    return out


def alternative_column(h: Any) -> str:
    """The text CLIs' column for an alternative: its word and probability, then a tab."""
    a = h.alternative
    return "" if a is None else f"{a.word}\t{a.probability:.4f}\t"


def origin_column(h: Any) -> str:
    """The text CLIs' --origin column: where the answer came from (model, memory or mixed), then a
    tab. Plain output never carries it: a line is the answer alone, as marian-decoder's is."""
    return f"{h.origin}\t"


def add_column_flags(p: argparse.ArgumentParser, line: str, low: str) -> None:
    """--confidence and --origin, the columns both CLIs may put before an answer: `line` names
    what a column begins, `low` says when its confidence is marked."""
    p.add_argument(
        "--confidence",
        action="store_true",
        help=f"begin each {line} with its confidence in [0, 1], followed by '?' when {low}",
    )
    p.add_argument(
        "--origin",
        action="store_true",
        help=f"begin each {line} with where it came from: model, memory or mixed (after the "
        "confidence with --confidence); plain output is the answer alone",
    )
