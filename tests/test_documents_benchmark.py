"""benchmarks/serving/documents_served.py runs its four phases on a real server and reports them
(its figures are not asserted: timing belongs in the script's output), and its documents cut into
the sentences they were drawn with."""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.sample_texts import bundle_texts
from benchmarks.serving import documents_served
from service.model.sentences import split_sentences
from tests.conftest import REPO

TRANSFORMER = REPO / "models" / "grc-en-nt-transformer"


def test_drawn_documents_cut_into_their_sentences() -> None:
    language = documents_served.source_language(TRANSFORMER)
    pool = documents_served.sentence_pool(bundle_texts(TRANSFORMER), language, 50)
    draw = documents_served.Draw(tuple(pool), language, 5, 50, 0.5)
    rng = random.Random(3)
    for _ in range(20):
        sentences = draw.sentences(rng)
        text = draw.join(rng, sentences)
        assert [text[a:b] for a, b in split_sentences(text, "on", language)] == sentences
    assert "\n" in text and " " in text


def test_documents_served_runs_every_phase_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "documents.json"
    status = documents_served.main(
        ["--bundle", str(TRANSFORMER), "--users", "4", "--document-users", "2",
         "--min-sentences", "2", "--max-sentences", "4", "--seconds", "1.5", "--warmup-s", "1",
         "--cooldown-s", "0.5", "--rounds", "1", "--client-processes", "1", "--json", str(out)]
    )  # fmt: skip
    assert status == 0
    report = json.loads(out.read_text())
    assert report["preflight"]["document_spans"] == 4
    (rows,) = report["rounds"]
    assert sorted(rows) == ["A", "B", "C", "D"]
    assert sorted(rows["A"]["roles"]) == ["single"]
    for phase, role in (("B", "document"), ("C", "walk"), ("D", "stream")):
        assert sorted(rows[phase]["roles"]) == sorted(["single", role])
    assert 2 <= rows["B"]["roles"]["document"]["sentences_per_request"] <= 4
    stream = rows["D"]["roles"]["stream"]
    assert stream["first_p50_ms"] <= stream["p50_ms"]  # the first message comes before the last
    assert set(report["ratios"]) >= {"b_over_c_sentences_per_s", "b_over_a_singles_p99"}
