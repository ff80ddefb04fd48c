"""Translations as JSON, one shape for every CLI: the engine's `Translation` (translate CLI) and the
client's `ClientTranslation` (client CLI) carry the same fields, so one function serves both."""

from __future__ import annotations

from typing import Any


def alignment_to_json(a: Any) -> dict[str, Any] | None:
    if a is None:
        return None
    return {
        "source_tokens": list(a.source_tokens),
        "target_tokens": list(a.target_tokens),
        "matrix": a.matrix.round(5).tolist(),
        "pharaoh": a.pharaoh,
    }


def translation_to_json(t: Any) -> dict[str, Any]:
    """A JSON-ready dict; matrices as nested lists rounded to 5 decimals."""
    return {
        "source": t.source,
        "source_tokens": list(t.source_tokens),
        "hypotheses": [
            {
                "text": h.text,
                "tokens": list(h.tokens),
                "score": h.score,
                "log_prob": h.log_prob,
                "finished": h.finished,
                "alignment": alignment_to_json(h.alignment),
            }
            for h in t.hypotheses
        ],
    }
