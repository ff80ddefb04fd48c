"""The explorer's Align form in a real browser (as tests/test_explorer.py): what it draws is what
the gRPC Align answer holds for the same pairs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proto.translation.v1 import translation_pb2 as pb
from service.serve.protocol import align_options_to_pb
from tests.conftest import REPO
from tests.test_explorer import (  # noqa: F401  (fixtures)
    WAIT_S,
    browser,
    downloads,
    open_page,
    page_url,
    ui,
)
from tests.test_server import (  # noqa: F401  (fixtures)
    ServerThread,
    base_args,
    bundle,
    engine,
    server,
)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

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
    # an RNN has one attention: no layer or head to choose
    assert not browser.find_element(By.ID, "align-layer").is_displayed()
    assert not browser.find_element(By.ID, "align-head").is_displayed()
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


TRANSFORMER = REPO / "models" / "grc-en-nt-transformer"


@pytest.fixture(scope="module")
def transformer_ui() -> Iterator[ServerThread]:
    srv = ServerThread.start([*base_args(TRANSFORMER), "--no-warmup", "--http-port", "0", "--ui"])
    yield srv
    srv.close()


def heatmap_weights(driver: Any) -> list[float]:
    card = driver.find_element(By.CSS_SELECTOR, ".align-card")
    cells = card.find_elements(By.CSS_SELECTOR, "svg.heatmap rect.cell")
    return [float(c.get_attribute("data-weight")) for c in cells]


def test_choosing_a_layer_and_head_redraws_the_heatmap_from_that_attention(
    transformer_ui: ServerThread,
    browser: Any,  # noqa: F811
) -> None:
    """On a Transformer the Align form lists its decoder layers and heads; choosing one aligns
    the pair again, and the heatmap then holds what gRPC Align answers for that layer and head
    (not what it held before)."""
    source, target = "ἐν ἀρχῇ ἦν ὁ λόγος", "In the beginning was the Word"
    open_page(browser, page_url(transformer_ui))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1"
    )
    layer, head = (
        Select(browser.find_element(By.ID, "align-layer")),
        Select(browser.find_element(By.ID, "align-head")),
    )
    assert browser.find_element(By.ID, "align-layer").is_displayed()
    assert [o.get_attribute("value") for o in layer.options] == ["", "0", "1", "2"]
    assert [o.get_attribute("value") for o in head.options] == ["", "0", "1", "2", "3"]
    browser.find_element(By.ID, "align-sources").send_keys(source)
    browser.find_element(By.ID, "align-targets").send_keys(target)
    browser.find_element(By.ID, "align").click()
    assert wait_aligned(browser) == "1", browser.find_element(By.ID, "align-status").text

    def answer(
        attention_layer: int | None = None, attention_head: int | None = None
    ) -> list[float]:
        options = align_options_to_pb(
            matrices="word", attention_layer=attention_layer, attention_head=attention_head
        )
        request = pb.AlignRequest(
            pairs=[pb.AlignPair(source=source, target=target)], options=options
        )
        return list(transformer_ui.stub.Align(request, timeout=WAIT_S).alignments[0].word.weights)

    own = answer()
    assert heatmap_weights(browser) == pytest.approx(own, abs=1e-6)
    chosen = answer(attention_layer=0, attention_head=1)
    assert chosen != pytest.approx(own, abs=1e-3)
    layer.select_by_value("0")
    head.select_by_value("1")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: wait_aligned(d) == "1" and heatmap_weights(d) == pytest.approx(chosen, abs=1e-6)
    )


def test_the_translations_heatmaps_follow_the_chosen_layer_and_head(
    transformer_ui: ServerThread,
    browser: Any,  # noqa: F811
) -> None:
    """The translation form's Layer and Head redraw every hypothesis's heatmap from that
    cross-attention: each then holds what gRPC Align answers for (the text, the hypothesis) by
    that layer and head; the model's own choice puts the search's matrices back."""
    text = "ἐν ἀρχῇ ἦν ὁ λόγος"
    open_page(browser, page_url(transformer_ui))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1"
    )
    browser.find_element(By.ID, "texts").send_keys(text)
    browser.find_element(By.ID, "nbest").clear()
    browser.find_element(By.ID, "nbest").send_keys("2")
    browser.find_element(By.ID, "translate").click()
    ready = WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") in ("1", "error")
    )
    assert ready
    beam = int(browser.find_element(By.ID, "beam").get_attribute("value"))  # the model's default
    options = pb.DecodingOptions(beam_size=beam, n_best=2, alignment=pb.ALIGNMENT_MODE_WORD)
    request = pb.TranslateRequest(texts=[text], options=options)
    hypotheses = transformer_ui.stub.Translate(request, timeout=WAIT_S).translations[0].hypotheses

    def cards() -> list[list[float]]:
        return [
            [
                float(c.get_attribute("data-weight"))
                for c in card.find_elements(By.CSS_SELECTOR, "svg.heatmap rect.cell")
            ]
            for card in browser.find_elements(By.CSS_SELECTOR, "#results .hyp")
        ]

    searched = [list(h.alignment.weights) for h in hypotheses]
    assert len(cards()) == 2
    for got, want in zip(cards(), searched, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    options = align_options_to_pb(matrices="word", attention_layer=1, attention_head=3)
    aligned = transformer_ui.stub.Align(
        pb.AlignRequest(
            pairs=[pb.AlignPair(source=text, target=h.text) for h in hypotheses], options=options
        ),
        timeout=WAIT_S,
    ).alignments
    chosen = [list(a.word.weights) for a in aligned]
    Select(browser.find_element(By.ID, "layer")).select_by_value("1")
    Select(browser.find_element(By.ID, "head")).select_by_value("3")

    def shows(d: Any, want: list[list[float]]) -> bool:
        if d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") != "1":
            return False
        got = cards()
        return len(got) == len(want) and all(
            g == pytest.approx(w, abs=1e-6) for g, w in zip(got, want, strict=True)
        )

    WebDriverWait(browser, WAIT_S).until(lambda d: shows(d, chosen))
    assert chosen[0] != pytest.approx(searched[0], abs=1e-3)
    Select(browser.find_element(By.ID, "layer")).select_by_value("")
    Select(browser.find_element(By.ID, "head")).select_by_value("")
    WebDriverWait(browser, WAIT_S).until(lambda d: shows(d, searched))


def test_a_link_keeps_the_layer_and_head(
    transformer_ui: ServerThread,
    browser: Any,  # noqa: F811
) -> None:
    """A pasted link with layer= and head= opens on that choice: the page translates and draws
    the heatmap from that cross-attention, as gRPC Align answers for it."""
    text = "ἐν ἀρχῇ ἦν ὁ λόγος"
    open_page(browser, page_url(transformer_ui, texts=text, nbest=1, layer=0, head=2))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") in ("1", "error")
    )
    assert browser.find_element(By.ID, "layer").get_attribute("value") == "0"
    assert browser.find_element(By.ID, "head").get_attribute("value") == "2"
    beam = int(browser.find_element(By.ID, "beam").get_attribute("value"))
    options = pb.DecodingOptions(beam_size=beam, n_best=1, alignment=pb.ALIGNMENT_MODE_WORD)
    best = (
        transformer_ui.stub.Translate(
            pb.TranslateRequest(texts=[text], options=options), timeout=WAIT_S
        )
        .translations[0]
        .hypotheses[0]
    )
    aligned = transformer_ui.stub.Align(
        pb.AlignRequest(
            pairs=[pb.AlignPair(source=text, target=best.text)],
            options=align_options_to_pb(matrices="word", attention_layer=0, attention_head=2),
        ),
        timeout=WAIT_S,
    ).alignments[0]
    card = browser.find_element(By.CSS_SELECTOR, "#results .hyp")
    cells = card.find_elements(By.CSS_SELECTOR, "svg.heatmap rect.cell")
    got = [float(c.get_attribute("data-weight")) for c in cells]
    assert got == pytest.approx(list(aligned.word.weights), abs=1e-6)
