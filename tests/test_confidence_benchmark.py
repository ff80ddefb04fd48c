"""benchmarks/quality/confidence.py's statistics against their definitions, and a run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.quality import confidence
from tests.conftest import DEFAULT_BUNDLE, REPO


def test_auroc_is_the_share_of_right_wrong_pairs_ordered_right_ties_half() -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 6, size=60).astype(float)  # many ties
    right = rng.random(60) < 0.4
    pos, neg = scores[right], scores[~right]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert confidence.auroc(scores, right) == pytest.approx(pairs / (len(pos) * len(neg)))
    assert confidence.auroc(np.array([0.9, 0.8, 0.1]), np.array([True, True, False])) == 1.0
    assert np.isnan(confidence.auroc(np.array([0.5]), np.array([True])))


def test_the_threshold_is_the_lowest_whose_accepted_answers_are_precise_enough() -> None:
    scores = np.array([0.99, 0.98, 0.97, 0.96, 0.95, 0.5])
    right = np.array([True, True, True, False, True, False])
    found = confidence.threshold_for_precision(scores, right, precision=0.8)
    assert found == {"threshold": 0.95, "coverage": 5 / 6, "right_kept": 1.0}
    strict = confidence.threshold_for_precision(scores, right, precision=0.99)
    assert strict["threshold"] == 0.97 and strict["coverage"] == 0.5
    tied = confidence.threshold_for_precision(
        np.array([0.9, 0.9]), np.array([True, False]), precision=0.99
    )
    assert tied["threshold"] is None  # the tie cannot be split


def test_a_small_run_prints_every_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "c.json"
    argv = ["--bundle", str(DEFAULT_BUNDLE), "--in-domain", "12", "--long", "4", "--outside", "4"]
    assert confidence.main([*argv, "--ood", "6", "--json", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["inputs"] == {
        "in_domain": 12,
        "long": 4,
        "outside_ranges": 4,
        "out_of_domain": 6,
    }
    assert printed["exact_match"]["out_of_domain"] == 0.0
    assert set(printed["by_confidence"]) == {"confidence", "lowest_segment", "log_prob", "score"}
    # a bundle whose input rule refuses digits: refused inputs count as wrong, never a crash
    assert confidence.main(["--bundle", str(REPO / "models" / "g2p"), *argv[2:], "--ood", "6"]) == 0
    refused = json.loads(capsys.readouterr().out)["refused"]
    assert refused["in_domain"] > 0
