"""The attention explorer in a real browser: Debian's chromium and chromedriver, headless, via selenium.

The page is loaded from a real server (--ui, HTTP on a free port); what it draws is compared with
what the gRPC API returns for the same request: the heatmap's cells and weights, the highlights on
hover, the downloaded JSON. Skipped where chromium, chromedriver or selenium is missing
(.ci/run installs them). With S2S_SCREENSHOTS=<dir> the test saves the page, one PNG per model.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from proto.translation.v1 import translation_pb2 as pb
from tests.conftest import REPO
from tests.test_server import (  # noqa: F401  (fixtures)
    ServerThread,
    base_args,
    bundle,
    engine,
    server,
    texts,
)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)",
)
WAIT_S = 60.0
TOL = 1e-6


@pytest.fixture(scope="module")
def ui(bundle: Path, engine: Any) -> Iterator[ServerThread]:  # noqa: F811
    srv = ServerThread.start(
        [*base_args(bundle), "--no-warmup", "--http-port", "0", "--ui"], engine
    )
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    # The driver is Debian's: with its path given, selenium-manager never tries to download one.
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def open_page(driver: Any, url: str) -> None:
    """A fresh load (a URL differing only in its fragment would not reload the page)."""
    driver.get("about:blank")
    driver.get(url)


def page_url(srv: ServerThread, **state: Any) -> str:
    base = f"http://127.0.0.1:{srv.r.http_port}/"
    return base + ("#" + urllib.parse.urlencode(state) if state else "")


def wait_ready(driver: Any) -> None:
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") in ("1", "error")
    )
    status = driver.find_element(By.ID, "status").text
    assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", status


def grpc_answer(
    srv: ServerThread, lines: list[str], beam: int, n_best: int
) -> pb.TranslateResponse:
    request = pb.TranslateRequest(
        texts=lines,
        options=pb.DecodingOptions(beam_size=beam, n_best=n_best, alignment=pb.ALIGNMENT_MODE_WORD),
    )
    return srv.stub.Translate(request, timeout=WAIT_S)


def clip(token: str, n: int = 16) -> str:
    return token if len(token) <= n else token[: n - 1] + "…"


def card(driver: Any, text: int, rank: int) -> Any:
    return driver.find_element(By.CSS_SELECTOR, f'.hyp[data-text="{text}"][data-rank="{rank}"]')


def weights_of(elements: list[Any]) -> list[float]:
    return [float(e.get_attribute("data-weight")) for e in elements]


def test_typed_batch_draws_the_grpc_weights(
    ui: ServerThread,
    browser: Any,
    texts: list[str],  # noqa: F811
) -> None:
    lines = texts[:3]
    open_page(browser, page_url(ui))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1"
    )
    box = browser.find_element(By.ID, "texts")
    box.clear()
    box.send_keys("\n".join(lines))
    for field, value in (("beam", "4"), ("nbest", "3")):
        element = browser.find_element(By.ID, field)
        element.clear()
        element.send_keys(value)
    browser.find_element(By.ID, "translate").click()
    wait_ready(browser)
    expected = grpc_answer(ui, lines, beam=4, n_best=3)
    sections = browser.find_elements(By.CSS_SELECTOR, "section.text")
    assert len(sections) == len(lines)
    for ti, translation in enumerate(expected.translations):
        assert len(sections[ti].find_elements(By.CSS_SELECTOR, ".hyp")) == len(
            translation.hypotheses
        )
        for hi, hyp in enumerate(translation.hypotheses):
            c = card(browser, ti, hi)
            assert c.find_element(By.CSS_SELECTOR, ".hyp-text").text == hyp.text
            assert c.find_element(By.CSS_SELECTOR, ".score").text == f"score {hyp.score:.3f}"
            badge = c.find_element(By.CSS_SELECTOR, ".confidence")  # the server's field, shown
            low = " (low)" if hyp.low_confidence else ""
            assert badge.text == f"confidence {hyp.confidence:.3f}{low}"
            assert ("low" in badge.get_attribute("class").split()) == hyp.low_confidence
            a = hyp.alignment
            heat = c.find_element(By.CSS_SELECTOR, "svg.heatmap")
            cells = heat.find_elements(By.CSS_SELECTOR, "rect.cell")
            assert len(cells) == a.rows * a.cols  # rows × columns cells
            got = weights_of(cells)  # row-major, as drawn
            assert got == pytest.approx(list(a.weights), abs=TOL)
            labels = heat.find_elements(By.CSS_SELECTOR, "text.tgt-label")
            assert [e.text for e in labels] == [clip(t) for t in a.target_tokens]
            labels = heat.find_elements(By.CSS_SELECTOR, "text.src-label")
            assert [e.get_attribute("textContent") for e in labels] == [
                clip(t) for t in a.source_tokens
            ]
            pairs = [p for p in a.pharaoh.split() if p]
            assert len(c.find_elements(By.CSS_SELECTOR, "svg.links line.link")) == len(pairs)
    # the input is in the URL: opening it again redraws the same view
    shared = browser.current_url
    state = urllib.parse.parse_qs(urllib.parse.urlparse(shared).fragment)
    assert state["texts"] == ["\n".join(lines)]
    assert state["beam"] == ["4"]
    open_page(browser, shared)
    wait_ready(browser)
    first = card(browser, 0, 0).find_elements(By.CSS_SELECTOR, "rect.cell")
    assert weights_of(first) == pytest.approx(
        list(expected.translations[0].hypotheses[0].alignment.weights), abs=TOL
    )


def test_hover_highlights_the_weights_both_ways(
    ui: ServerThread,
    browser: Any,
    texts: list[str],  # noqa: F811
) -> None:
    lines = texts[3:5]
    open_page(browser, page_url(ui, texts="\n".join(lines), beam=3, nbest=2, alignment="word"))
    wait_ready(browser)
    a = grpc_answer(ui, lines, beam=3, n_best=2).translations[0].hypotheses[0].alignment
    rows, cols = a.rows, a.cols
    heat = card(browser, 0, 0).find_element(By.CSS_SELECTOR, "svg.heatmap")
    i = rows - 1
    ActionChains(browser).move_to_element(
        heat.find_element(By.CSS_SELECTOR, f'text.tgt-label[data-row="{i}"]')
    ).perform()
    cells = heat.find_elements(By.CSS_SELECTOR, "rect.cell")
    lit = [c for c in cells if "hl" in c.get_attribute("class").split()]
    assert [int(c.get_attribute("data-row")) for c in lit] == [i] * cols
    src = heat.find_elements(By.CSS_SELECTOR, "text.src-label")
    assert weights_of(src) == pytest.approx(list(a.weights[i * cols : (i + 1) * cols]), abs=TOL)
    tooltip = browser.find_element(By.ID, "tooltip")
    assert tooltip.is_displayed()
    j = 0
    ActionChains(browser).move_to_element(
        heat.find_element(By.CSS_SELECTOR, f'text.src-label[data-col="{j}"]')
    ).perform()
    lit = [c for c in cells if "hl" in c.get_attribute("class").split()]
    assert [int(c.get_attribute("data-col")) for c in lit] == [j] * rows
    tgt = heat.find_elements(By.CSS_SELECTOR, "text.tgt-label")
    assert weights_of(tgt) == pytest.approx([a.weights[r * cols + j] for r in range(rows)], abs=TOL)
    links = card(browser, 0, 0).find_elements(By.CSS_SELECTOR, "line.link")
    expected_lit = sum(1 for p in a.pharaoh.split() if int(p.split("-")[0]) == j)
    assert sum(1 for x in links if "hl" in x.get_attribute("class").split()) == expected_lit
    cell = heat.find_element(By.CSS_SELECTOR, f'rect.cell[data-row="0"][data-col="{j}"]')
    ActionChains(browser).move_to_element(cell).perform()
    assert f"{a.weights[j]:.3f}" in tooltip.text


def wait_file(path: Path) -> Path:
    deadline = time.monotonic() + WAIT_S
    while not (path.exists() and path.stat().st_size > 0):
        assert time.monotonic() < deadline, f"{path.name} was not downloaded"
        time.sleep(0.05)
    time.sleep(0.2)  # chromium renames the finished download into place
    return path


def test_downloads_json_equal_to_the_api_and_png(
    ui: ServerThread,
    browser: Any,
    downloads: Path,
    texts: list[str],  # noqa: F811
) -> None:
    lines = texts[5:8]
    open_page(browser, page_url(ui, texts="\n".join(lines), beam=4, nbest=2, alignment="word"))
    wait_ready(browser)
    browser.find_element(By.ID, "download-json").click()
    got = json.loads(wait_file(downloads / "translation.json").read_text())
    answer = json_format.ParseDict(got, pb.TranslateResponse())
    expected = grpc_answer(ui, lines, beam=4, n_best=2)
    assert answer.model_version == expected.model_version
    assert list(answer.translations) == list(expected.translations)
    card(browser, 1, 1).find_element(By.CSS_SELECTOR, "button.download-png").click()
    png = wait_file(downloads / "alignment-2-2.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    a = expected.translations[1].hypotheses[1].alignment
    width = int.from_bytes(png[16:20], "big")
    assert width >= 2 * 26 * a.cols  # two pixels per unit, 26 units per cell


XSS = ["<script>window.__xss = 1</script>", '<img src=x onerror="window.__xss = 2">']


def test_input_and_output_are_text_never_html(ui: ServerThread, browser: Any) -> None:
    lines = [*XSS, "one <b>two</b> & three"]
    for how in ("typed", "url"):
        open_page(browser, page_url(ui) if how == "typed" else page_url(ui, texts="\n".join(lines)))
        if how == "typed":
            WebDriverWait(browser, WAIT_S).until(
                lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1"
            )
            box = browser.find_element(By.ID, "texts")
            box.clear()
            box.send_keys("\n".join(lines))
            browser.find_element(By.ID, "translate").click()
        wait_ready(browser)
        assert browser.execute_script("return window.__xss") is None
        results = browser.find_element(By.ID, "results")
        assert results.find_elements(By.TAG_NAME, "img") == []
        assert results.find_elements(By.TAG_NAME, "script") == []
        assert results.find_elements(By.TAG_NAME, "b") == []
        headings = [h.text for h in results.find_elements(By.TAG_NAME, "h2")]
        assert headings == [f"{i + 1}. {line}" for i, line in enumerate(lines)]


def test_api_errors_are_shown_as_text(ui: ServerThread, browser: Any) -> None:
    open_page(browser, page_url(ui, texts="one", beam=2, nbest=5))
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "error"
    )
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("INVALID_ARGUMENT: ")
    assert "n_best" in status


BUNDLES = sorted(p.parent for p in (REPO / "models").glob("*/manifest.json"))
# What each embedded model is shown translating, and at which alignment level (a G2P source is one
# word, so its letters are the subwords worth seeing); S2S_SCREENSHOT_TEXTS="a|b" overrides the texts.
SCREENSHOT_TEXTS = {
    "default": ["one thousand, two hundred and eighty-seven", "March 5, 2021"],
    "g2p": ["attention", "explorer", "alignment"],
}
SCREENSHOT_ALIGNMENT = {"g2p": "subword"}


@pytest.mark.parametrize("model", BUNDLES, ids=lambda p: p.name)
def test_screenshot_for_the_docs(model: Path, browser: Any) -> None:
    """Saved only when S2S_SCREENSHOTS names a folder (the docs' pictures come from here), one per
    bundle under models/."""
    folder = os.environ.get("S2S_SCREENSHOTS")
    if not folder:
        pytest.skip("set S2S_SCREENSHOTS=<folder> to save the page's screenshots")
    override = os.environ.get("S2S_SCREENSHOT_TEXTS")
    lines = override.split("|") if override else SCREENSHOT_TEXTS.get(model.name, ["hello"])
    srv = ServerThread.start([*base_args(model), "--no-warmup", "--http-port", "0", "--ui"])
    try:
        open_page(
            browser,
            page_url(
                srv,
                texts="\n".join(lines),
                beam=4,
                nbest=2,
                alignment=SCREENSHOT_ALIGNMENT.get(model.name, "word"),
            ),
        )
        wait_ready(browser)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1400, min(int(height) + 40, 2400))
        heat = card(browser, 0, 0).find_element(By.CSS_SELECTOR, "svg.heatmap")
        ActionChains(browser).move_to_element(
            heat.find_element(By.CSS_SELECTOR, 'text.tgt-label[data-row="0"]')
        ).perform()
        Path(folder).mkdir(parents=True, exist_ok=True)
        path = Path(folder) / f"{srv.r.engine.bundle.name}.png"
        assert browser.save_screenshot(str(path))
        assert path.stat().st_size > 10_000
    finally:
        browser.set_window_size(1400, 1000)
        srv.close()
