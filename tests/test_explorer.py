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
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from proto.translation.v1 import translation_pb2 as pb
from service.model.bundle import load_bundle
from tests.conftest import REPO
from tests.test_server import (  # noqa: F401  (fixtures)
    QUIET_SERVER_FLAGS,
    ServerThread,
    base_args,
    bundle,
    engine,
    flag_list,
    server,
    texts,
)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

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


# --- the explorer follows the server: default model, header, domain, the drawn grid --------------

VIRIDIS = [  # app.js's polynomial: the page's colour for a weight, to read the drawn grid back
    [0.2777273272234177, 0.005407344544966578, 0.3340998053353061],
    [0.1050930431085774, 1.404613529898575, 1.384590162594685],
    [-0.3308618287255563, 0.214847559468213, 0.09509516302823659],
    [-4.634230498983486, -5.799100973351585, -19.33244095627987],
    [6.228269936347081, 14.17993336680509, 56.69055260068105],
    [4.776384997670288, -13.74514537774601, -65.35303263337234],
    [-5.435455855934631, 4.645852612178535, 26.3124352495832],
]


def viridis(t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    rgb = []
    for k in range(3):
        v = VIRIDIS[6][k]
        for i in range(5, -1, -1):
            v = VIRIDIS[i][k] + t * v
        rgb.append(int(255 * min(1.0, max(0.0, v)) + 0.5))
    return rgb[0], rgb[1], rgb[2]


def rgb_of(fill: str) -> tuple[int, int, int]:
    r, g, b = (int(x) for x in fill.removeprefix("rgb(").removesuffix(")").split(","))
    return r, g, b


@pytest.fixture(scope="module")
def repository() -> Iterator[ServerThread]:
    """The embedded models as scripts/serve.sh serves them: a repository, the explorer on."""
    srv = ServerThread.start(
        [
            *flag_list({"--models": str(REPO / "models"), **QUIET_SERVER_FLAGS}),
            *("--no-warmup", "--http-port", "0", "--ui", "--reload-interval-s", "0"),
        ]
    )
    yield srv
    srv.close()


def http_json(srv: ServerThread, method: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{srv.r.http_port}/v1/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


def wait_loaded(driver: Any) -> None:
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1"
    )


def test_the_page_opens_on_the_default_model_and_follows_the_choice(
    repository: ServerThread, browser: Any
) -> None:
    listed = http_json(repository, "ListModels", {})
    default = listed["default_model"]
    others = [m["name"] for m in listed["models"] if m["name"] != default]
    assert others and sorted([default, *others])[0] != default  # alphabetical order would differ
    open_page(browser, page_url(repository))
    wait_loaded(browser)
    select = browser.find_element(By.ID, "model")
    assert select.get_attribute("value") == default
    header, domain = (
        browser.find_element(By.ID, "model-info"),
        browser.find_element(By.ID, "model-domain"),
    )
    info = http_json(repository, "GetModelInfo", {})
    assert header.get_attribute("data-model") == default
    assert header.text.startswith(f"{default} {info['version']}")
    assert info["description"] and info["description"] in domain.text
    # a shared link without model= translates on the default model
    open_page(browser, page_url(repository, texts="ninety-seven", beam=2, nbest=1))
    wait_ready(browser)
    assert f"model {default} " in browser.find_element(By.ID, "status").text
    # choosing another model: the header and the domain follow it
    other = others[0]
    other_info = http_json(repository, "GetModelInfo", {"model": {"name": other}})
    Select(browser.find_element(By.ID, "model")).select_by_value(other)
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.ID, "model-info").get_attribute("data-model") == other
    )
    header = browser.find_element(By.ID, "model-info")
    assert header.text.startswith(f"{other} {other_info['version']}")
    assert other_info["description"] in browser.find_element(By.ID, "model-domain").text
    # and a link naming it opens on it
    open_page(browser, page_url(repository, model=other))
    wait_loaded(browser)
    assert browser.find_element(By.ID, "model").get_attribute("value") == other
    assert browser.find_element(By.ID, "model-info").get_attribute("data-model") == other


# Where each cell, row label and column label of a heatmap is drawn (client pixels).
GEOMETRY_JS = """
const svg = arguments[0];
const box = (e) => { const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
return {
  cells: [...svg.querySelectorAll("rect.cell")].map((c) => ({...box(c), fill: c.getAttribute("fill")})),
  rows: [...svg.querySelectorAll("text.tgt-label")].map((t) => ({...box(t), text: t.textContent})),
  cols: [...svg.querySelectorAll("text.src-label")].map((t) => ({...box(t), text: t.textContent})),
};
"""


def drawn_grid(driver: Any, heat: Any) -> list[list[tuple[int, int, int]]]:
    """The heatmap as drawn: each cell's colour at the row of the target label level with it and the
    column of the source label that starts above it (labels are rotated up and right from their
    column's middle), as colours [row][col]."""
    g = driver.execute_script(GEOMETRY_JS, heat)
    n_rows, n_cols = len(g["rows"]), len(g["cols"])
    grid: list[list[tuple[int, int, int] | None]] = [[None] * n_cols for _ in range(n_rows)]
    for cell in g["cells"]:
        rows = [
            i
            for i, label in enumerate(g["rows"])
            if cell["top"] <= (label["top"] + label["bottom"]) / 2 <= cell["bottom"]
        ]
        cols = [
            j
            for j, label in enumerate(g["cols"])
            if cell["left"] <= label["left"] + 3 <= cell["right"]
        ]
        assert len(rows) == 1 and len(cols) == 1, (cell, rows, cols)
        assert grid[rows[0]][cols[0]] is None  # one cell per place
        grid[rows[0]][cols[0]] = rgb_of(cell["fill"])
    assert all(c is not None for row in grid for c in row)
    return grid  # type: ignore[return-value]


EXAMPLES = {
    "default": (["ninety-seven and march 5, 2021", "one thousand, two hundred and eight"], "word"),
    "g2p": (["attention", "explorer"], "subword"),
}


@pytest.mark.parametrize("folder", sorted(EXAMPLES))
def test_every_drawn_cell_is_the_apis_matrix_cell(
    repository: ServerThread, browser: Any, folder: str
) -> None:
    """Read back from the drawing (positions and colours, not the page's own data attributes),
    every hypothesis's grid is /v1/Translate's matrix; the pointer on a cell highlights exactly
    that cell, and the tooltip names that cell's tokens and weight."""
    lines, alignment = EXAMPLES[folder]
    name = load_bundle(REPO / "models" / folder).name
    mode = {"word": "ALIGNMENT_MODE_WORD", "subword": "ALIGNMENT_MODE_SUBWORD"}[alignment]
    answer = http_json(
        repository,
        "Translate",
        {
            "texts": lines,
            "model": {"name": name},
            "options": {"beam_size": 3, "n_best": 2, "alignment": mode},
        },
    )
    open_page(
        browser,
        page_url(
            repository, texts="\n".join(lines), beam=3, nbest=2, alignment=alignment, model=name
        ),
    )
    wait_ready(browser)
    for ti, translation in enumerate(answer["translations"]):
        for hi, hyp in enumerate(translation["hypotheses"]):
            a = hyp["alignment"]
            heat = card(browser, ti, hi).find_element(By.CSS_SELECTOR, "svg.heatmap")
            grid = drawn_grid(browser, heat)
            assert (len(grid), len(grid[0])) == (a["rows"], a["cols"])
            weights = [a["weights"][i * a["cols"] : (i + 1) * a["cols"]] for i in range(a["rows"])]
            assert grid == [[viridis(w) for w in row] for row in weights]
    # the pointer on each cell of the first answer: that cell, and no other, is highlighted
    a = answer["translations"][0]["hypotheses"][0]["alignment"]
    heat = card(browser, 0, 0).find_element(By.CSS_SELECTOR, "svg.heatmap")
    rects = heat.find_elements(By.CSS_SELECTOR, "rect.cell")
    g = browser.execute_script(GEOMETRY_JS, heat)
    tooltip = browser.find_element(By.ID, "tooltip")
    for rect, box in zip(rects, g["cells"], strict=True):
        i = next(
            k
            for k, r in enumerate(g["rows"])
            if box["top"] <= (r["top"] + r["bottom"]) / 2 <= box["bottom"]
        )
        j = next(k for k, c in enumerate(g["cols"]) if box["left"] <= c["left"] + 3 <= box["right"])
        ActionChains(browser).move_to_element(rect).perform()
        lit = heat.find_elements(By.CSS_SELECTOR, "rect.cell.hl")
        assert lit == [rect]
        weight = a["weights"][i * a["cols"] + j]
        assert tooltip.text == f"{a['target_tokens'][i]} → {a['source_tokens'][j]}: {weight:.3f}"


def test_out_of_domain_text_is_flagged_unmistakably(repository: ServerThread, browser: Any) -> None:
    lines = ["The weather is lovely today, isn't it?", "ninety-seven"]
    answer = http_json(
        repository, "Translate", {"texts": lines, "options": {"beam_size": 2, "n_best": 1}}
    )
    flags = [t["hypotheses"][0]["low_confidence"] for t in answer["translations"]]
    assert flags[0]  # English prose is outside the numbers model's domain
    open_page(browser, page_url(repository, texts="\n".join(lines), beam=2, nbest=1))
    wait_ready(browser)
    info = http_json(repository, "GetModelInfo", {})
    for ti, low in enumerate(flags):
        c = card(browser, ti, 0)
        assert ("low-confidence" in c.get_attribute("class").split()) == low
        warnings = c.find_elements(By.CSS_SELECTOR, ".low-warning")
        assert len(warnings) == int(low)
        if low:
            assert warnings[0].is_displayed()
            assert "Low confidence" in warnings[0].text and info["description"] in warnings[0].text


def test_a_typed_start_is_continued_with_the_next_words_and_kept_in_the_url(
    ui: ServerThread,
    browser: Any,
    texts: list[str],  # noqa: F811
) -> None:
    line, prefix = texts[0], "un"
    open_page(
        browser, page_url(ui, texts=line, beam="4", nbest="2", alignment="word", prefix=prefix)
    )
    wait_ready(browser)
    assert browser.find_element(By.ID, "prefix").get_attribute("value") == prefix
    # the completion: the API's answer for the same start, heatmap rows over prefix and completion
    expected = ui.stub.Translate(
        pb.TranslateRequest(
            texts=[line],
            options=pb.DecodingOptions(
                beam_size=4, n_best=2, alignment=pb.ALIGNMENT_MODE_WORD, target_prefix=[prefix]
            ),
        ),
        timeout=WAIT_S,
    )
    for hi, hyp in enumerate(expected.translations[0].hypotheses):
        c = card(browser, 0, hi)
        assert c.find_element(By.CSS_SELECTOR, ".hyp-text").text == hyp.text
        assert hyp.text.startswith(prefix)
        cells = c.find_elements(By.CSS_SELECTOR, "svg.heatmap rect.cell")
        assert weights_of(cells) == pytest.approx(list(hyp.alignment.weights), abs=TOL)
    # the next words: the API's alternatives, with their probabilities
    alternatives = ui.stub.Translate(
        pb.TranslateRequest(
            texts=[line],
            options=pb.DecodingOptions(
                beam_size=5, n_best=1, return_alternatives=5, target_prefix=[prefix]
            ),
        ),
        timeout=WAIT_S,
    )
    items = browser.find_elements(By.CSS_SELECTOR, 'ol.alternatives[data-text="0"] li.alternative')
    want = alternatives.translations[0].hypotheses
    assert [i.get_attribute("data-word") for i in items] == [h.alternative.word for h in want]
    assert [float(i.get_attribute("data-probability")) for i in items] == pytest.approx(
        [h.alternative.probability for h in want], abs=1e-6
    )
    # taking a word extends the start and translates again
    word = want[0].alternative.word
    items[0].find_element(By.CSS_SELECTOR, "button.take-word").click()
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.ID, "prefix").get_attribute("value") != prefix
    )
    wait_ready(browser)
    extended = browser.find_element(By.ID, "prefix").get_attribute("value")
    assert extended.startswith(prefix) and extended.endswith(word)
    state = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).fragment)
    assert state["prefix"] == [extended]
    assert card(browser, 0, 0).find_element(By.CSS_SELECTOR, ".hyp-text").text.startswith(extended)


def test_a_tagged_answer_is_shown_with_its_tags_as_text(
    ui: ServerThread,
    browser: Any,
    texts: list[str],  # noqa: F811
) -> None:
    """markup=xml in the URL: each hypothesis shows the API's answer with its tags highlighted
    (text, never elements), its plain text, and the plain text's heatmap; Align shows the target
    with the source's tags."""
    words = texts[1].split()
    line = f'<b>{words[0]}</b> {" ".join(words[1:])} <x id="1"/>'
    open_page(
        browser, page_url(ui, texts=line, beam="3", nbest="2", alignment="word", markup="xml")
    )
    wait_ready(browser)
    expected = ui.stub.Translate(
        pb.TranslateRequest(
            texts=[line],
            options=pb.DecodingOptions(
                beam_size=3, n_best=2, alignment=pb.ALIGNMENT_MODE_WORD, markup="xml"
            ),
        ),
        timeout=WAIT_S,
    )
    results = browser.find_element(By.ID, "results")
    assert results.find_elements(By.TAG_NAME, "b") == []  # a tag is shown, never made
    for hi, hyp in enumerate(expected.translations[0].hypotheses):
        c = card(browser, 0, hi)
        shown = c.find_element(By.CSS_SELECTOR, ".hyp-text.tagged")
        assert shown.get_attribute("data-text") == hyp.text
        assert shown.text == hyp.text
        tags = [t.text for t in shown.find_elements(By.CSS_SELECTOR, "span.tag")]
        assert sorted(tags) == sorted(["<b>", "</b>", '<x id="1"/>'])
        assert hyp.plain_text in c.find_element(By.CSS_SELECTOR, ".plain-text").text
        cells = c.find_elements(By.CSS_SELECTOR, "svg.heatmap rect.cell")
        assert weights_of(cells) == pytest.approx(list(hyp.alignment.weights), abs=TOL)
    state = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).fragment)
    assert state["markup"] == ["xml"]
    # Align: the target with the source's tags
    source, target = f"<b>{words[0]}</b> {' '.join(words[1:])}", "un deux trois"
    browser.find_element(By.ID, "align-sources").send_keys(source)
    browser.find_element(By.ID, "align-targets").send_keys(target)
    Select(browser.find_element(By.ID, "align-markup")).select_by_value("xml")
    browser.find_element(By.ID, "align").click()
    WebDriverWait(browser, WAIT_S).until(
        lambda d: (
            d.find_element(By.TAG_NAME, "body").get_attribute("data-aligned") in ("1", "error")
        )
    )
    want = ui.stub.Align(
        pb.AlignRequest(
            pairs=[pb.AlignPair(source=source, target=target)],
            options=pb.AlignOptions(alignment=pb.ALIGNMENT_MODE_WORD, markup="xml"),
        ),
        timeout=WAIT_S,
    )
    shown = browser.find_element(By.CSS_SELECTOR, ".align-card .tagged-target .tagged")
    assert shown.get_attribute("data-text") == want.alignments[0].tagged_target


def test_a_memory_answer_as_written_marks_what_the_vocabulary_cannot_spell(
    bundle: Path,  # noqa: F811
    browser: Any,
    tmp_path: Path,
) -> None:
    """A memory entry whose target the model cannot spell ("(TM)": capitals and brackets) is
    shown as written, with a badge naming the words the vocabulary cannot spell and their heatmap
    rows marked."""
    name = load_bundle(bundle).name
    memories = tmp_path / "memories"
    memories.mkdir()
    (memories / f"{name}.tsv").write_text("ninety-eight\tquatre-vingt-dix-huit (TM)\n", "utf-8")
    srv = ServerThread.start(
        [
            *base_args(bundle),
            "--no-warmup",
            "--http-port",
            "0",
            "--ui",
            "--memory-dir",
            str(memories),
        ]
    )
    try:
        open_page(browser, page_url(srv, texts="ninety-eight", beam=2, nbest=1))
        wait_ready(browser)
        c = card(browser, 0, 0)
        assert c.find_element(By.CSS_SELECTOR, ".hyp-text").text == "quatre-vingt-dix-huit (TM)"
        badge = c.find_element(By.CSS_SELECTOR, ".badge.unknown")
        assert badge.text == "unknown to the vocabulary: (TM)"
        marked = c.find_elements(By.CSS_SELECTOR, "svg.heatmap text.tgt-label.unknown")
        assert [e.text for e in marked] == ["(TM)"]
    finally:
        srv.close()


def test_each_text_lists_its_glossary_terms_kept_and_not_and_why(
    ui: ServerThread,
    browser: Any,
    engine: Any,  # noqa: F811
    texts: list[str],  # noqa: F811
) -> None:
    """Terms typed beside the texts: each text lists the terms that apply to it, as the API says,
    kept or not and why (an overlap names the term kept instead); they stay in the URL."""
    text = next(t for t in texts if len(t.split()) >= 3 and not engine.prepare(t).segments)
    words = text.split()
    first, second = " ".join(words[:2]), " ".join(words[1:3])
    glossary = f"{first} ||| mille\n{second} ||| cent"
    open_page(browser, page_url(ui, texts=text, beam=3, nbest=1, glossary=glossary))
    wait_ready(browser)
    items = browser.find_elements(By.CSS_SELECTOR, 'section.text[data-text="0"] ul.terms li')
    assert [i.get_attribute("data-status") for i in items] == [
        "TERM_STATUS_KEPT",
        "TERM_STATUS_OVERLAPPED",
    ]
    assert items[0].text == f"{first} → mille kept"
    assert items[1].text == (
        f"{second} → cent not kept: its source overlaps the term kept instead ({first} → mille)"
    )
    state = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).fragment)
    assert state["glossary"] == [glossary]
