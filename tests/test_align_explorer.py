"""The explorer's Align form in a real browser (as tests/test_explorer.py): what it draws is what
the gRPC Align answer holds for the same pairs."""

from __future__ import annotations

from typing import Any

import pytest

from proto.translation.v1 import translation_pb2 as pb
from tests.test_explorer import (  # noqa: F401  (fixtures)
    WAIT_S,
    browser,
    downloads,
    open_page,
    page_url,
    ui,
)
from tests.test_server import ServerThread, bundle, engine, server  # noqa: F401  (fixtures)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(webdriver, "Chrome"), reason="selenium without Chrome support"
)


def wait_aligned(driver: Any) -> str:
    WebDriverWait(driver, WAIT_S).until(
        lambda d: (
            d.find_element(By.TAG_NAME, "body").get_attribute("data-aligned") in ("1", "error")
        )
    )
    return str(driver.find_element(By.TAG_NAME, "body").get_attribute("data-aligned"))


def test_the_explorer_draws_an_align_answer(ui: ServerThread, browser: Any) -> None:  # noqa: F811
    pairs = [("twenty three", "vingt trois"), ("one hundred and five", "cent cinq")]
    open_page(browser, page_url(ui))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1"
    )
    browser.find_element(By.ID, "align-sources").send_keys("\n".join(s for s, _ in pairs))
    browser.find_element(By.ID, "align-targets").send_keys("\n".join(t for _, t in pairs))
    browser.find_element(By.ID, "align").click()
    assert wait_aligned(browser) == "1", browser.find_element(By.ID, "align-status").text
    want = ui.stub.Align(
        pb.AlignRequest(
            pairs=[pb.AlignPair(source=s, target=t) for s, t in pairs],
            options=pb.AlignOptions(alignment=pb.ALIGNMENT_MODE_WORD),
        ),
        timeout=WAIT_S,
    )
    cards = browser.find_elements(By.CSS_SELECTOR, ".align-card")
    assert len(cards) == len(pairs)
    for card, a in zip(cards, want.alignments, strict=True):
        cells = card.find_elements(By.CSS_SELECTOR, "svg.heatmap rect.cell")
        assert len(cells) == a.word.rows * a.word.cols == len(a.target_words) * len(a.source_words)
        weights = [float(c.get_attribute("data-weight")) for c in cells]
        assert weights == pytest.approx(list(a.word.weights), abs=1e-6)
        lines = card.find_elements(By.CSS_SELECTOR, "svg.links line.link")
        assert len(lines) == len(a.pharaoh.split())
        assert f"log P {a.log_prob:.3f}" in card.text
    # an empty target is refused, the message naming the pair
    browser.find_element(By.ID, "align-targets").clear()
    browser.find_element(By.ID, "align-targets").send_keys("vingt trois")
    browser.find_element(By.ID, "align").click()
    assert wait_aligned(browser) == "error"
    assert "pairs[1].target" in browser.find_element(By.ID, "align-status").text
