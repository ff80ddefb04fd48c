// The attention explorer: calls the server's HTTP/JSON API (/v1/...) and draws every hypothesis's
// alignment as an SVG heatmap and as links. No library, no network access but this origin.
// Safety: every piece of user input and model output reaches the page through textContent or
// setAttribute on SVG attributes that are never scripts; nothing is ever parsed as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CELL = 26; // heatmap cell size in px
const ALIGNMENT = { none: "ALIGNMENT_MODE_NONE", subword: "ALIGNMENT_MODE_SUBWORD", word: "ALIGNMENT_MODE_WORD" };

const state = { models: [], listed: false, defaultModel: "", infos: {}, response: null, request: null };
const $ = (id) => document.getElementById(id);

// --- colour: viridis as a degree-6 polynomial (fit by Matt Zucker, public domain) -------------
const VIRIDIS = [
  [0.2777273272234177, 0.005407344544966578, 0.3340998053353061],
  [0.1050930431085774, 1.404613529898575, 1.384590162594685],
  [-0.3308618287255563, 0.214847559468213, 0.09509516302823659],
  [-4.634230498983486, -5.799100973351585, -19.33244095627987],
  [6.228269936347081, 14.17993336680509, 56.69055260068105],
  [4.776384997670288, -13.74514537774601, -65.35303263337234],
  [-5.435455855934631, 4.645852612178535, 26.3124352495832],
];
function viridis(t) {
  t = Math.min(1, Math.max(0, t));
  const rgb = [0, 1, 2].map((k) => {
    let v = VIRIDIS[6][k];
    for (let i = 5; i >= 0; i--) v = VIRIDIS[i][k] + t * v;
    return Math.round(255 * Math.min(1, Math.max(0, v)));
  });
  return `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
}
const textColour = (t) => (t > 0.6 ? "#000" : "#fff");

// --- small DOM helpers (text only) -------------------------------------------------------------
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = String(text);
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}
function setStatus(text, isError) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", Boolean(isError));
}
function showTip(event, text) {
  const tip = $("tooltip");
  tip.textContent = text;
  tip.hidden = false;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
}
const hideTip = () => { $("tooltip").hidden = true; };
const clip = (s, n) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);

// --- API ----------------------------------------------------------------------------------------
async function api(method, body) {
  const init = body === undefined ? { method: "GET" } : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(`/v1/${method}`, init);
  let payload = null;
  try { payload = await response.json(); } catch (e) { payload = null; }
  if (!response.ok) {
    const code = payload && payload.code ? payload.code : `HTTP ${response.status}`;
    const message = payload && payload.message ? payload.message : response.statusText;
    const err = new Error(`${code}: ${message}`);
    err.status = response.status;
    throw err;
  }
  return payload;
}

async function loadModels() {
  // ListModels when the server has a model repository; else the one model GetModelInfo describes.
  // The list opens on the server's default model (the one requests without a model get).
  let defaultName = "";
  try {
    const listed = await api("ListModels", {});
    state.models = (listed.models || []).map((m) => ({ name: m.name, version: m.version || "", info: m }));
    state.listed = state.models.length > 0;
    defaultName = listed.default_model || (state.models.find((m) => m.info.is_default) || {}).name || "";
  } catch (e) {
    state.listed = false;
  }
  const info = await api("GetModelInfo");
  if (!state.listed) state.models = [{ name: info.name, version: info.version, info }];
  state.defaultModel = defaultName || info.name;
  const select = $("model");
  select.replaceChildren();
  for (const m of state.models) {
    const label = m.version ? `${m.name} ${m.version}` : m.name;
    const option = el("option", "", m.name === state.defaultModel ? `${label} (default)` : label);
    option.value = m.name;
    select.append(option);
  }
  select.value = state.defaultModel;
  select.addEventListener("change", () => { showModel(select.value); });
  const defaults = info.defaults || {};
  if (!location.hash) {
    $("beam").value = defaults.beam_size || 5;
    $("nbest").value = Math.min(3, defaults.beam_size || 5);
  }
  state.infos = { [info.name]: info };
  await showModel(select.value);
}

async function modelInfo(name) {
  // The chosen model's own GetModelInfo (its version, limits, threshold and domain), fetched once.
  if (!state.infos[name]) {
    const m = state.models.find((x) => x.name === name);
    state.infos[name] = await api("GetModelInfo", { model: { name, version: m ? m.version : "" } });
  }
  return state.infos[name];
}

async function showModel(name) {
  // The header and the form's limits follow the model chosen in the list.
  const info = await modelInfo(name);
  const limits = info.limits || {};
  $("beam").max = limits.max_beam_size || 16;
  $("nbest").max = limits.max_beam_size || 16;
  const header = $("model-info");
  header.dataset.model = info.name;
  header.textContent = `${info.name} ${info.version}${info.is_default ? " (default)" : ""} · up to ${limits.max_texts} texts of ${limits.max_text_chars} characters · beam ≤ ${limits.max_beam_size}`;
  const domain = $("model-domain");
  domain.dataset.model = info.name;
  domain.textContent = domainText(info);
  $("model-threshold").textContent = thresholdText(info);
  if ($("align-layer")) showAttentionChoice(info);
}

function domainText(info) {
  // The domain line promises a flag only where the model has a threshold that raises one.
  if (!info.description) return "This model does not describe its domain.";
  const flagged = Number(info.confidence_threshold || 0) > 0
    ? "those below its confidence threshold are flagged low confidence"
    : "this model has no confidence threshold, so they are not flagged: judge its answers against this domain";
  return `Domain: ${info.description}. Text outside it gets answers that look fluent but are wrong; ${flagged}.`;
}

function thresholdText(info) {
  const threshold = Number(info.confidence_threshold || 0);
  return threshold > 0
    ? `Answers with confidence below ${threshold.toFixed(4)} are flagged low confidence.`
    : "This model has no confidence threshold: no answer is flagged.";
}

// --- URL state: the inputs live in the fragment, so a view can be shared ------------------------
function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has("texts")) $("texts").value = p.get("texts");
  if (p.has("beam")) $("beam").value = p.get("beam");
  if (p.has("nbest")) $("nbest").value = p.get("nbest");
  $("prefix").value = p.get("prefix") || "";
  $("glossary").value = p.get("glossary") || "";
  $("markup").value = ["xml", "html"].includes(p.get("markup")) ? p.get("markup") : "none";
  if (p.has("alignment") && ALIGNMENT[p.get("alignment")]) $("alignment").value = p.get("alignment");
  // A link without model= (or naming a model not served) means the server's default model.
  const named = p.get("model");
  $("model").value = named && state.models.some((m) => m.name === named) ? named : state.defaultModel;
  // a Transformer's layer and head: set once showModel has listed the model's (showAttentionChoice)
  state.hashChoice = { layer: p.get("layer") || "", head: p.get("head") || "" };
  return p.has("texts");
}
function writeHash() {
  const p = new URLSearchParams({
    texts: $("texts").value, beam: $("beam").value, nbest: $("nbest").value,
    alignment: $("alignment").value, model: $("model").value,
  });
  if ($("prefix").value) p.set("prefix", $("prefix").value);
  if ($("glossary").value.trim()) p.set("glossary", $("glossary").value);
  if ($("markup").value !== "none") p.set("markup", $("markup").value);
  if ($("layer").value) p.set("layer", $("layer").value);
  if ($("head").value) p.set("head", $("head").value);
  history.replaceState(null, "", `#${p.toString()}`);
}

// --- translate ----------------------------------------------------------------------------------
function buildRequest() {
  const texts = $("texts").value.split("\n").map((t) => t.replace(/\r$/, "")).filter((t) => t.trim() !== "");
  const request = {
    texts,
    options: {
      beam_size: Number($("beam").value),
      n_best: Number($("nbest").value),
      alignment: ALIGNMENT[$("alignment").value],
    },
  };
  const prefix = $("prefix").value;
  if (prefix.trim() !== "") request.options.target_prefix = texts.map(() => prefix);
  if ($("markup").value !== "none") request.options.markup = $("markup").value;
  const terms = glossaryTerms($("glossary").value);
  if (terms.length) request.options.glossary = terms;
  if (state.listed) {
    const m = state.models.find((x) => x.name === $("model").value);
    if (m) request.model = { name: m.name, version: m.version };
  }
  return request;
}

// "source ||| target" lines (a line without "|||" is a target-only term); blank lines skipped.
function glossaryTerms(text) {
  return text.split("\n").filter((line) => line.trim() !== "").map((line) => {
    const at = line.indexOf("|||");
    return at < 0 ? { source: "", target: line.trim() } : { source: line.slice(0, at).trim(), target: line.slice(at + 3).trim() };
  });
}

async function translate() {
  const request = buildRequest();
  if (request.texts.length === 0) { setStatus("Type at least one text (one per line).", true); return; }
  writeHash();
  document.body.dataset.ready = "0";
  setStatus("translating…");
  $("translate").disabled = true;
  const started = performance.now();
  try {
    const response = await api("Translate", request);
    const alternatives = request.options.target_prefix ? await api("Translate", alternativesRequest(request)) : null;
    state.request = request;
    state.response = response;
    state.original = JSON.parse(JSON.stringify(response)); // the search's own matrices
    state.alternatives = alternatives;
    state.shownModel = response.model || $("model").value;
    render(request, response, alternatives);
    $("download-json").disabled = false;
    const ms = Math.round(performance.now() - started);
    setStatus(`${response.translations.length} text(s) translated in ${ms} ms · model ${response.model} ${response.model_version} · request ${response.request_id}`);
    document.body.dataset.ready = "1";
    if (Object.keys(attentionChoice("layer", "head")).length) await redrawByAttention();
  } catch (err) {
    setStatus(err.message, true);
    document.body.dataset.ready = "error";
  } finally {
    $("translate").disabled = false;
  }
}

// --- rendering ----------------------------------------------------------------------------------
function confidence(h) {
  // The server's: exp(log_prob / tokens, end-of-sentence included), over every segment's tokens for an
  // input the model's segmentation cut. JSON leaves out a zero.
  return Number(h.confidence || 0);
}

// The next words after the typed start: the same texts and start, return_alternatives (the k best
// words, each with its best continuation), no matrices.
const ALTERNATIVES = 5;
function alternativesRequest(request) {
  const info = state.infos[$("model").value] || {};
  const maxBeam = (info.limits && info.limits.max_beam_size) || 16;
  const maxAlternatives = (info.limits && info.limits.max_alternatives) || ALTERNATIVES;
  const k = Math.min(ALTERNATIVES, maxAlternatives, maxBeam);
  const beam = Math.min(maxBeam, Math.max(request.options.beam_size, k));
  const options = { ...request.options, beam_size: beam, n_best: 1, return_alternatives: k, alignment: ALIGNMENT.none };
  delete options.glossary; // a glossary is kept by the beam search, which alternatives do not run
  return { ...request, options };
}

function alternativesList(t, ti) {
  const list = el("ol", "alternatives");
  list.dataset.text = ti;
  const prefix = $("prefix").value;
  (t.hypotheses || []).forEach((h) => {
    const a = h.alternative || {};
    const item = el("li", "alternative");
    item.dataset.word = a.word || "";
    item.dataset.probability = Number(a.probability || 0);
    const take = el("button", "take-word", a.word || "");
    take.type = "button";
    take.title = "continue the translation with this word";
    take.addEventListener("click", () => {
      // the start extended to the end of this word, as this continuation writes it
      const at = h.text.indexOf(a.word, Math.max(0, prefix.trimEnd().length));
      $("prefix").value = at >= 0 ? h.text.slice(0, at + a.word.length) : `${prefix} ${a.word}`;
      translate();
    });
    item.append(take, el("span", "probability", `${(100 * Number(a.probability || 0)).toFixed(1)}%`), el("span", "continuation", h.text));
    list.append(item);
  });
  return list;
}

function render(request, response, alternatives) {
  const results = $("results");
  results.replaceChildren();
  response.translations.forEach((t, ti) => {
    const section = el("section", "text");
    section.dataset.text = ti;
    section.append(el("h2", "", `${ti + 1}. ${request.texts[ti]}`));
    if ((t.glossary || []).length) section.append(glossaryList(t.glossary));
    if (alternatives) {
      section.append(el("p", "muted", "Next words after the start, with their probabilities and best continuations:"));
      section.append(alternativesList(alternatives.translations[ti], ti));
    }
    const hyps = el("div", "hyps");
    (t.hypotheses || []).forEach((h, hi) => hyps.append(hypothesisCard(h, ti, hi)));
    section.append(hyps);
    results.append(section);
  });
}

// The glossary terms that apply to a text and what became of each on the best answer.
const TERM_STATUS = {
  TERM_STATUS_KEPT: "kept",
  TERM_STATUS_OVERLAPPED: "not kept: its source overlaps the term kept instead",
  TERM_STATUS_CUT: "not kept: the answer reached its maximum length before it",
};
function termText(term) {
  return `${term.source || "(every text)"} → ${term.target}`;
}
function glossaryList(uses) {
  const list = el("ul", "terms");
  for (const u of uses) {
    const kept = u.status === "TERM_STATUS_KEPT";
    const item = el("li", kept ? "term kept" : "term not-kept");
    item.dataset.status = u.status;
    let why = TERM_STATUS[u.status] || u.status;
    if (u.kept_instead) why += ` (${termText(u.kept_instead)})`;
    item.append(el("span", "term-text", termText(u.term || {})), " ", el("span", "term-status", why));
    if (u.request_index === undefined) item.append(" ", el("span", "badge", "the model's glossary"));
    list.append(item);
  }
  return list;
}

function hypothesisCard(h, ti, hi) {
  const card = el("div", "hyp");
  card.dataset.text = ti;
  card.dataset.rank = hi;
  const head = el("div", "hyp-head");
  head.append(el("span", "badge", `#${hi + 1}`));
  head.append(h.plain_text ? taggedText(h.text, "hyp-text tagged") : el("span", "hyp-text", h.text));
  head.append(el("span", "badge score", `score ${Number(h.score || 0).toFixed(3)}`));
  const conf = el("span", h.low_confidence ? "badge confidence low" : "badge confidence", `confidence ${confidence(h).toFixed(3)}${h.low_confidence ? " (low)" : ""}`);
  conf.title = h.low_confidence
    ? "below the server's confidence threshold: check this answer"
    : "geometric-mean token probability: exp(log_prob / tokens)";
  head.append(conf);
  head.append(el("span", h.finished ? "badge finished" : "badge unfinished", h.finished ? "finished" : "not finished (cut at max length)"));
  if (h.origin === "ORIGIN_MEMORY" || h.origin === "ORIGIN_MIXED") {
    const whole = h.origin === "ORIGIN_MEMORY";
    const origin = el("span", "badge origin memory", whole ? "from memory" : "partly from memory");
    origin.title = whole
      ? "the model's memory answered this text; its scores and heatmap are the model's for this target"
      : "the model's memory answered some segments of this input, the model the others";
    head.append(origin);
  }
  const unknown = unknownBadge(h);
  if (unknown) head.append(unknown);
  card.append(head);
  if (h.plain_text) card.append(el("p", "muted plain-text", `plain text (the heatmap's): ${h.plain_text}`));
  if (h.low_confidence) {
    card.classList.add("low-confidence");
    const info = state.infos[state.shownModel] || {};
    const domain = info.description ? ` The model's domain: ${info.description}.` : "";
    card.append(el("p", "low-warning", `⚠ Low confidence: this answer is probably wrong. The input may be outside what the model was trained on.${domain}`));
  }
  const a = h.alignment;
  if (!a || !a.rows || !a.cols) {
    card.append(el("p", "muted no-alignment", "no alignment (alignment mode none, or a model without attention)"));
    return card;
  }
  const view = { rows: a.rows, cols: a.cols, weights: a.weights, src: a.source_tokens, tgt: a.target_tokens, pharaoh: a.pharaoh || "", unknownRows: a.unknown_target_tokens || [] };
  const heat = heatmap(view);
  const links = linksView(view);
  card.append(heat.node, links.node);
  linkHighlights(view, heat, links);
  const actions = el("div", "hyp-actions");
  const png = el("button", "download-png", "Download PNG");
  png.type = "button";
  png.addEventListener("click", () => downloadPng(view, `alignment-${ti + 1}-${hi + 1}.png`));
  actions.append(png);
  card.append(actions);
  return card;
}

// A memory's target served as written: what the model's vocabulary cannot spell, named by the
// alignment's rows (words or pieces) where there is one, else counted.
function unknownBadge(h) {
  const tokens = h.unknown_tokens || [];
  if (!tokens.length) return null;
  const a = h.alignment;
  const rows = (a && a.unknown_target_tokens) || [];
  const named = rows.length ? rows.map((i) => a.target_tokens[i]).join(" ") : `${tokens.length} token${tokens.length > 1 ? "s" : ""}`;
  const badge = el("span", "badge unknown", `unknown to the vocabulary: ${named}`);
  badge.title = "served as the memory wrote it; the model's vocabulary cannot spell this, so its scores and heatmap read it as the unknown token";
  return badge;
}

function heatmap(v) {
  const left = 12 + 8 * Math.min(16, Math.max(...v.tgt.map((s) => s.length), 1));
  const top = 12 + 7 * Math.min(16, Math.max(...v.src.map((s) => s.length), 1));
  const width = left + v.cols * CELL + Math.round(0.7 * (top - 12)) + 4; // rotated labels reach right
  const height = top + v.rows * CELL + 4;
  const node = svg("svg", { class: "heatmap", width, height, viewBox: `0 0 ${width} ${height}`, "data-rows": v.rows, "data-cols": v.cols });
  const cells = [];
  const srcLabels = [];
  const tgtLabels = [];
  for (let j = 0; j < v.cols; j++) {
    const x = left + j * CELL + CELL / 2;
    const label = svg("text", { class: "label src-label", "data-col": j, x, y: top - 6, transform: `rotate(-50 ${x} ${top - 6})` }, clip(v.src[j], 16));
    node.append(label);
    srcLabels.push(label);
  }
  for (let i = 0; i < v.rows; i++) {
    const y = top + i * CELL + CELL / 2 + 4;
    const unknown = (v.unknownRows || []).includes(i) ? " unknown" : "";
    const label = svg("text", { class: `label tgt-label${unknown}`, "data-row": i, x: left - 6, y, "text-anchor": "end" }, clip(v.tgt[i], 16));
    node.append(label);
    tgtLabels.push(label);
    const row = [];
    for (let j = 0; j < v.cols; j++) {
      const w = v.weights[i * v.cols + j];
      const cell = svg("rect", {
        class: "cell", x: left + j * CELL, y: top + i * CELL, width: CELL, height: CELL,
        fill: viridis(w), "data-row": i, "data-col": j, "data-weight": w,
      });
      cell.append(svg("title", {}, `${v.tgt[i]} → ${v.src[j]}: ${w.toFixed(3)}`));
      node.append(cell);
      row.push(cell);
    }
    cells.push(row);
  }
  return { node, cells, srcLabels, tgtLabels };
}

function linksView(v) {
  // The hard alignment (pharaoh "src-tgt" pairs) as lines between the source words (top) and the target words (bottom).
  const pitch = 9;
  const gap = 12;
  const place = (tokens) => {
    let x = 4;
    return tokens.map((t) => { const w = Math.max(1, clip(t, 16).length) * 7.2 + gap; const c = x + w / 2 - gap / 2; x += w; return { c, x0: x - w }; });
  };
  const sp = place(v.src);
  const tp = place(v.tgt);
  const width = Math.max(sp.length ? sp[sp.length - 1].x0 : 0, tp.length ? tp[tp.length - 1].x0 : 0) + 140;
  const height = 86;
  const node = svg("svg", { class: "links", width, height, viewBox: `0 0 ${width} ${height}` });
  const srcWords = v.src.map((t, j) => { const w = svg("text", { class: "word src-word", "data-col": j, x: sp[j].x0, y: 14 }, clip(t, 16)); node.append(w); return w; });
  const tgtWords = v.tgt.map((t, i) => { const w = svg("text", { class: "word tgt-word", "data-row": i, x: tp[i].x0, y: height - 6 }, clip(t, 16)); node.append(w); return w; });
  const lines = [];
  for (const pair of v.pharaoh.split(/\s+/).filter(Boolean)) {
    const [s, t] = pair.split("-").map(Number);
    if (!(s >= 0 && s < v.cols && t >= 0 && t < v.rows)) continue;
    const line = svg("line", { class: "link", x1: sp[s].c, y1: 20, x2: tp[t].c, y2: height - 20, "data-col": s, "data-row": t });
    node.append(line);
    lines.push(line);
  }
  void pitch;
  return { node, srcWords, tgtWords, lines };
}

function linkHighlights(v, heat, links) {
  const clear = () => {
    for (const row of heat.cells) for (const c of row) c.classList.remove("hl", "dim");
    for (const l of [...heat.srcLabels, ...heat.tgtLabels, ...links.srcWords, ...links.tgtWords]) {
      l.classList.remove("hl");
      l.removeAttribute("data-weight");
      l.style.fill = "";
    }
    for (const l of links.lines) l.classList.remove("hl");
    hideTip();
  };
  const weightLabel = (label, w) => {
    // The other axis' tokens take the weight's colour (darkened text for light weights) and carry it.
    label.setAttribute("data-weight", w);
    label.style.fill = w > 0.05 ? viridis(Math.max(w, 0.15)) : "";
  };
  const focusRow = (i, event) => {
    clear();
    heat.tgtLabels[i].classList.add("hl");
    links.tgtWords[i].classList.add("hl");
    heat.cells.forEach((row, r) => row.forEach((c) => c.classList.add(r === i ? "hl" : "dim")));
    for (let j = 0; j < v.cols; j++) { weightLabel(heat.srcLabels[j], v.weights[i * v.cols + j]); weightLabel(links.srcWords[j], v.weights[i * v.cols + j]); }
    for (const l of links.lines) if (Number(l.dataset.row) === i) l.classList.add("hl");
    if (event) showTip(event, v.src.map((s, j) => `${s}  ${v.weights[i * v.cols + j].toFixed(3)}`).join("\n"));
  };
  const focusCol = (j, event) => {
    clear();
    heat.srcLabels[j].classList.add("hl");
    links.srcWords[j].classList.add("hl");
    heat.cells.forEach((row) => row.forEach((c, cj) => c.classList.add(cj === j ? "hl" : "dim")));
    for (let i = 0; i < v.rows; i++) { weightLabel(heat.tgtLabels[i], v.weights[i * v.cols + j]); weightLabel(links.tgtWords[i], v.weights[i * v.cols + j]); }
    for (const l of links.lines) if (Number(l.dataset.col) === j) l.classList.add("hl");
    if (event) showTip(event, v.tgt.map((t, i) => `${t}  ${v.weights[i * v.cols + j].toFixed(3)}`).join("\n"));
  };
  heat.tgtLabels.forEach((l, i) => l.addEventListener("mouseenter", (e) => focusRow(i, e)));
  links.tgtWords.forEach((l, i) => l.addEventListener("mouseenter", (e) => focusRow(i, e)));
  heat.srcLabels.forEach((l, j) => l.addEventListener("mouseenter", (e) => focusCol(j, e)));
  links.srcWords.forEach((l, j) => l.addEventListener("mouseenter", (e) => focusCol(j, e)));
  const focusCell = (i, j, event) => {
    // The cell under the pointer is the one highlighted (not the row last hovered by its label).
    clear();
    heat.cells[i][j].classList.add("hl");
    heat.tgtLabels[i].classList.add("hl");
    heat.srcLabels[j].classList.add("hl");
    showTip(event, `${v.tgt[i]} → ${v.src[j]}: ${v.weights[i * v.cols + j].toFixed(3)}`);
  };
  heat.cells.forEach((row, i) => row.forEach((c, j) => {
    c.addEventListener("mouseenter", (e) => focusCell(i, j, e));
  }));
  heat.node.addEventListener("mouseleave", clear);
  links.node.addEventListener("mouseleave", clear);
}

// --- downloads ----------------------------------------------------------------------------------
function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function downloadJson() {
  if (!state.response) return;
  save(new Blob([JSON.stringify(state.response, null, 2)], { type: "application/json" }), "translation.json");
}

function downloadPng(v, name) {
  // Drawn afresh on a canvas (text with fillText), at twice the size for sharpness.
  const scale = 2;
  const left = 12 + 8 * Math.min(16, Math.max(...v.tgt.map((s) => s.length), 1));
  const top = 12 + 7 * Math.min(16, Math.max(...v.src.map((s) => s.length), 1));
  const canvas = document.createElement("canvas");
  canvas.width = (left + v.cols * CELL + 4) * scale;
  canvas.height = (top + v.rows * CELL + 4) * scale;
  const ctx = canvas.getContext("2d");
  ctx.scale(scale, scale);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = "12px monospace";
  for (let i = 0; i < v.rows; i++) {
    for (let j = 0; j < v.cols; j++) {
      const w = v.weights[i * v.cols + j];
      ctx.fillStyle = viridis(w);
      ctx.fillRect(left + j * CELL, top + i * CELL, CELL - 1, CELL - 1);
      ctx.fillStyle = textColour(w);
      ctx.textAlign = "center";
      if (w >= 0.1) ctx.fillText(w.toFixed(1), left + j * CELL + CELL / 2, top + i * CELL + CELL / 2 + 4);
    }
    ctx.fillStyle = "#000";
    ctx.textAlign = "right";
    ctx.fillText(clip(v.tgt[i], 16), left - 6, top + i * CELL + CELL / 2 + 4);
  }
  for (let j = 0; j < v.cols; j++) {
    ctx.save();
    ctx.translate(left + j * CELL + CELL / 2, top - 6);
    ctx.rotate(-50 * Math.PI / 180);
    ctx.textAlign = "left";
    ctx.fillStyle = "#000";
    ctx.fillText(clip(v.src[j], 16), 0, 0);
    ctx.restore();
  }
  canvas.toBlob((blob) => save(blob, name), "image/png");
}

// --- start ----------------------------------------------------------------------------------------
function drawScale() {
  const bar = $("scale");
  for (let k = 0; k <= 20; k++) { const s = el("span"); s.style.background = viridis(k / 20); bar.append(s); }
}

async function start() {
  drawScale();
  $("form").addEventListener("submit", (e) => { e.preventDefault(); translate(); });
  $("download-json").addEventListener("click", downloadJson);
  try {
    await loadModels();
  } catch (err) {
    setStatus(`cannot reach the model: ${err.message}`, true);
    return;
  }
  document.body.dataset.loaded = "1";
  window.addEventListener("hashchange", async () => { // a pasted link
    const go = readHash();
    await showModel($("model").value);
    if (go) translate();
  });
  const go = readHash();
  await showModel($("model").value);
  if (go) await translate();
}

document.addEventListener("DOMContentLoaded", start);

// --- markup: an answer with its tags, drawn as text (never parsed as HTML) -----------------------
function taggedText(text, cls) {
  const span = el("span", cls);
  span.dataset.text = text;
  // tags and comments highlighted; everything else is the translation's own text
  for (const part of text.split(/(<[^<>]*>)/)) {
    if (part === "") continue;
    span.append(part.startsWith("<") && part.endsWith(">") ? el("span", "tag", part) : document.createTextNode(part));
  }
  return span;
}

// --- forced alignment (Align) ----------------------------------------------------------------------
// Its own form and results below the translations: (source, target) pairs teacher-forced by the
// server, drawn with the same heatmap and links as a translation.
function setAlignStatus(text, isError) {
  const s = $("align-status");
  s.textContent = text;
  s.classList.toggle("error", Boolean(isError));
}

function buildAlignRequest() {
  const lines = (id) => $(id).value.split("\n").map((t) => t.replace(/\r$/, ""));
  const trim = (xs) => { while (xs.length && xs[xs.length - 1].trim() === "") xs.pop(); return xs; };
  const sources = trim(lines("align-sources"));
  const targets = trim(lines("align-targets"));
  const n = Math.max(sources.length, targets.length);
  // a side shorter than the other gets empty lines: the server names the pair that lacks one
  const pairs = Array.from({ length: n }, (_, i) => ({ source: sources[i] || "", target: targets[i] || "" }));
  const options = { alignment: $("align-level").value === "word" ? "ALIGNMENT_MODE_WORD" : "ALIGNMENT_MODE_SUBWORD" };
  if ($("align-links").value) options.links = $("align-links").value;
  if ($("align-markup").value !== "none") options.markup = $("align-markup").value;
  Object.assign(options, attentionChoice("align-layer", "align-head"));
  const request = { pairs, options };
  if (state.listed) {
    const m = state.models.find((x) => x.name === $("model").value);
    if (m) request.model = { name: m.name, version: m.version };
  }
  return request;
}

async function alignPairs() {
  const request = buildAlignRequest();
  if (request.pairs.length === 0) { setAlignStatus("Type a source and its target (one pair per line).", true); return; }
  document.body.dataset.aligned = "0";
  setAlignStatus("aligning…");
  $("align").disabled = true;
  const started = performance.now();
  const asked = (state.alignAsked = (state.alignAsked || 0) + 1);
  try {
    const response = await api("Align", request);
    if (asked !== state.alignAsked) return; // a later Align (another layer or head) is on its way
    renderAlign(request, response);
    const ms = Math.round(performance.now() - started);
    setAlignStatus(`${response.alignments.length} pair(s) aligned in ${ms} ms · model ${response.model} ${response.model_version} · request ${response.request_id}`);
    document.body.dataset.aligned = "1";
  } catch (err) {
    if (asked !== state.alignAsked) return;
    setAlignStatus(err.message, true);
    document.body.dataset.aligned = "error";
  } finally {
    $("align").disabled = false;
  }
}

function renderAlign(request, response) {
  const results = $("align-results");
  results.replaceChildren();
  response.alignments.forEach((a, i) => results.append(alignCard(a, request.pairs[i], i)));
}

function alignCard(a, pair, i) {
  const card = el("div", "hyp align-card");
  card.dataset.pair = i;
  const head = el("div", "hyp-head");
  head.append(el("span", "badge", `#${i + 1}`));
  head.append(el("span", "hyp-text", `${pair.source}  →  ${pair.target}`));
  const logProb = Number(a.log_prob || 0);
  head.append(el("span", "badge score", `log P ${logProb.toFixed(3)}`));
  head.append(el("span", "badge confidence", `confidence ${Number(a.confidence || 0).toFixed(3)}`));
  const unknown = [
    ...(a.unknown_source_words || []).map((j) => (a.source_words || [])[j]),
    ...(a.unknown_target_words || []).map((j) => (a.target_words || [])[j]),
  ];
  if (unknown.length) head.append(el("span", "badge unknown", `unknown to the vocabulary: ${unknown.join(" ")}`));
  card.append(head);
  if (a.tagged_target) {
    const tagged = el("p", "tagged-target", "with the source's markup: ");
    tagged.append(taggedText(a.tagged_target, "hyp-text tagged"));
    card.append(tagged);
  }
  card.append(el("p", "muted pharaoh", `links: ${a.pharaoh || "(none)"}`));
  const m = a.word && a.word.rows ? a.word : a.subword;
  if (!m || !m.rows || !m.cols) return card;
  // the word heatmap draws the links the server extracted; the subword one its argmax per row
  const view = { rows: m.rows, cols: m.cols, weights: m.weights, src: m.source_tokens, tgt: m.target_tokens, pharaoh: m.pharaoh || "" };
  const heat = heatmap(view);
  const links = linksView(view);
  card.append(heat.node, links.node);
  linkHighlights(view, heat, links);
  return card;
}

// A Transformer's decoder layer and head to align by (AlignOptions.attention_layer/_head): the
// selectors list the model's layers and heads; choosing one aligns the pairs again, so the
// heatmap changes under the user's eyes. Hidden for an RNN (one attention).
function showAttentionChoice(info) {
  let shape = null;
  try { shape = JSON.parse(info.architecture_json || "{}").transformer || null; } catch (e) { shape = null; }
  document.querySelectorAll(".attention-choice").forEach((label) => { label.hidden = !shape; });
  fillAttentionChoice($("layer"), $("head"), shape);
  fillAttentionChoice($("align-layer"), $("align-head"), shape);
  const wanted = state.hashChoice || {};
  for (const id of ["layer", "head"]) { // a link's choice, where this model has it
    if ([...$(id).options].some((o) => o.value === wanted[id])) $(id).value = wanted[id];
  }
}

function fillAttentionChoice(layer, head, shape) {
  layer.replaceChildren();
  head.replaceChildren();
  if (!shape) return;
  const alignLayer = ((shape.align_layer % shape.dec_layers) + shape.dec_layers) % shape.dec_layers;
  const heads = (shape.align_heads || []).length ? `heads ${shape.align_heads.join(", ")}` : "heads averaged";
  const own = el("option", "", `the model's (layer ${alignLayer + 1}, ${heads})`);
  own.value = "";
  layer.append(own);
  for (let i = 0; i < shape.dec_layers; i++) {
    const option = el("option", "", `layer ${i + 1}${i === alignLayer ? " (alignment)" : ""}`);
    option.value = String(i);
    layer.append(option);
  }
  const average = el("option", "", "heads averaged");
  average.value = "";
  head.append(average);
  for (let h = 0; h < shape.heads; h++) {
    const option = el("option", "", `head ${h + 1}`);
    option.value = String(h);
    head.append(option);
  }
}

function realign() {
  // a new layer or head redraws pairs aligned (or being aligned); before the first Align it only
  // sets the form
  if (["0", "1"].includes(document.body.dataset.aligned)) alignPairs();
}

// The AlignOptions fields of a pair of Layer and Head selectors (none: the model's own choice).
function attentionChoice(layerId, headId) {
  const options = {};
  if ($(layerId).value !== "") options.attention_layer = Number($(layerId).value);
  if ($(headId).value !== "") options.attention_head = Number($(headId).value);
  return options;
}

// The translation's heatmaps by another layer and head: each hypothesis shown is aligned (Align,
// teacher-forced on its text) by the chosen cross-attention and redrawn; the model's own choice
// puts back the matrices the search returned.
async function redrawByAttention() {
  if (!state.response || !state.original) return;
  writeHash(); // the link keeps the choice
  const choice = attentionChoice("layer", "head");
  const asked = (state.redrawAsked = (state.redrawAsked || 0) + 1);
  const response = JSON.parse(JSON.stringify(state.original));
  document.body.dataset.ready = "0";
  try {
    if (Object.keys(choice).length) {
      const shown = [];
      response.translations.forEach((t, ti) => (t.hypotheses || []).forEach((h) => {
        if (h.alignment && h.alignment.rows) shown.push({ h, source: state.request.texts[ti], target: h.plain_text || h.text });
      }));
      const info = state.infos[state.shownModel] || {};
      const size = (info.limits && info.limits.max_texts) || 16;
      const options = { ...choice, alignment: state.request.options.alignment };
      if (state.request.options.markup) options.markup = state.request.options.markup;
      for (let i = 0; i < shown.length; i += size) {
        const part = shown.slice(i, i + size);
        const request = { pairs: part.map((x) => ({ source: x.source, target: x.target })), options, model: state.request.model };
        const answer = await api("Align", request);
        part.forEach((x, j) => {
          const a = answer.alignments[j];
          const m = a.word && a.word.rows ? a.word : a.subword;
          x.h.alignment = { ...m, unknown_target_tokens: [] };
        });
      }
    }
    if (asked !== state.redrawAsked) return; // a later choice is on its way
    state.response = response;
    render(state.request, response, state.alternatives);
    setStatus(Object.keys(choice).length ? `heatmaps by ${describeChoice(choice)} (each hypothesis aligned again)` : "heatmaps as the search returned them");
    document.body.dataset.ready = "1";
  } catch (err) {
    if (asked !== state.redrawAsked) return;
    setStatus(err.message, true);
    document.body.dataset.ready = "error";
  }
}

function describeChoice(choice) {
  const layer = choice.attention_layer === undefined ? "the alignment layer" : `layer ${choice.attention_layer + 1}`;
  return choice.attention_head === undefined ? `${layer}, heads averaged` : `${layer}, head ${choice.attention_head + 1}`;
}

function startAlign() {
  if (!$("align-form")) return;
  $("layer").addEventListener("change", redrawByAttention);
  $("head").addEventListener("change", redrawByAttention);
  $("align-form").addEventListener("submit", (e) => { e.preventDefault(); alignPairs(); });
  $("align-layer").addEventListener("change", realign);
  $("align-head").addEventListener("change", realign);
}

document.addEventListener("DOMContentLoaded", startAlign);
