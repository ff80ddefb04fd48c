"""What the alignments are for, measured on the Greek New Testament (docs/markup.md).

    python -m benchmarks.alignment.markup --part align --split dev           # choose rules here
    python -m benchmarks.alignment.markup --part align --split test --json docs/benchmarks/markup-align-john.json
    python -m benchmarks.alignment.markup --part translate --split test --json docs/benchmarks/markup-translate-john.json

Gold links (data/grc-en/SPLIT.pharaoh, `python -m export.data.bible --out data/grc-en`) are read to
sample the spans and to score, never by what is scored.

- **align**: per verse, one span of 1-3 Greek words whose gold English words are contiguous (the
  words a tag around them should cover), drawn with a seed; the source is sent to `Align` with the
  span inside `<b>…</b>` (markup "xml") and the English verse as the target, and the `<b>` of
  `tagged_target` is compared with the gold span: exact span match and word F1. Links: each
  bundle's link head (its default), its attention (`grow`), and eflomal 2.0.0 run the usual way
  (grow-diag-final-and, one run, over the text of train, dev and the split), projected by the
  same rules (service/decode/align/projection.py over its hard links). Beside each, the naive
  projection: the first to the last target word linked to the span.
- **translate**: the first N verses, each with 1-3 of a pair of tags around 1-3 words, a
  self-closing code and a placeholder, translated with markup "xml" and without any markup (the
  same verse, tags and placeholders taken out), beam 5, batches of 32, one thread: well-formed
  answers, every tag and placeholder present, and the text without them identical; the time of each.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.alignment.align_modes import read_split
from service.decode.align.aligner import align
from service.decode.align.forced import AlignOptions
from service.decode.align.links import Link, parse_pharaoh
from service.decode.align.projection import link_weights, project
from service.decode.engine.engine import Engine
from service.decode.shared.config import EngineLimits, RuntimeConfig
from service.model import glossary, markup

SEEDS = (1, 2, 3)
BATCH = 64


def load(bundle: str | Path) -> Engine:
    return Engine.load(
        bundle,
        RuntimeConfig(providers=("CPUExecutionProvider",), intra_op_threads=1),
        EngineLimits(max_source_tokens=4096, max_length=4096),
    )


# --- spans ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """A tagged span of one verse: source words first..last, gold target words lo..hi."""

    verse: int
    first: int
    last: int
    lo: int
    hi: int


def sample_spans(
    pairs: Sequence[tuple[str, str]], golds: Sequence[set[Link]], seed: int
) -> list[Span]:
    """One span per verse that has one: uniformly among the spans of 1-3 source words whose gold
    target words are contiguous (and not none)."""
    rng = random.Random(seed)
    out = []
    for v, ((source, _), gold) in enumerate(zip(pairs, golds, strict=True)):
        n = len(source.split())
        candidates = []
        for size in (1, 2, 3):
            for first in range(n - size + 1):
                targets = sorted({t for s, t in gold if first <= s < first + size})
                if targets and targets[-1] - targets[0] + 1 == len(targets):
                    candidates.append(Span(v, first, first + size - 1, targets[0], targets[-1]))
        if candidates:
            out.append(rng.choice(candidates))
    return out


def tagged_source(source: str, span: Span) -> str:
    """The source with `<b>…</b>` around the span's words (XML: other text escaped)."""
    words = [html.escape(w, quote=False) for w in source.split()]
    words[span.first] = "<b>" + words[span.first]
    words[span.last] = words[span.last] + "</b>"
    return " ".join(words)


def tag_words(tagged: str) -> tuple[int, int] | None:
    """The words of a tagged target inside its `<b>` (first, last); None for an empty one."""
    marked = markup.parse(tagged, "xml", (markup.NO_PROTECT,))
    element = next(n for n in marked.nodes if isinstance(n, markup.Element))
    inside = [
        i
        for i, word in enumerate(_spans(marked.plain))
        if word[0] < element.end and word[1] > element.start
    ]
    return (inside[0], inside[-1]) if inside else None


def _spans(text: str) -> list[tuple[int, int]]:
    from service.decode.shared.alignment import word_spans

    return word_spans(text)


def first_to_last(links: set[Link], span: Span) -> tuple[int, int] | None:
    """The naive projection: the first to the last target word linked to the span's words."""
    targets = [t for s, t in links if span.first <= s <= span.last]
    return (min(targets), max(targets)) if targets else None


@dataclass
class Score:
    exact: int = 0
    f1: float = 0.0
    spans: int = 0

    def add(self, predicted: tuple[int, int] | None, span: Span) -> None:
        self.spans += 1
        if predicted is None:
            return
        self.exact += predicted == (span.lo, span.hi)
        got = set(range(predicted[0], predicted[1] + 1))
        gold = set(range(span.lo, span.hi + 1))
        both = len(got & gold)
        self.f1 += 2 * both / (len(got) + len(gold)) if both else 0.0

    @property
    def exact_rate(self) -> float:
        return self.exact / max(self.spans, 1)

    @property
    def f1_rate(self) -> float:
        return self.f1 / max(self.spans, 1)


# --- the align part -------------------------------------------------------------------------------


def aer(links: Sequence[set[Link]], golds: Sequence[set[Link]]) -> float:
    from export.metrics.aer import score_corpus

    return round(score_corpus(links, golds).aer, 4)


Projected = tuple[list[tuple[int, int] | None], list[set[Link]]]  # spans' words, pairs' links


def served(
    engine: Engine, pairs: Sequence[tuple[str, str]], spans: list[Span], links: str
) -> Projected:
    """Align with markup: each span's projected words, and each pair's hard links."""
    options = AlignOptions(links=links, matrices="none", markup="xml")
    jobs = [(tagged_source(pairs[s.verse][0], s), pairs[s.verse][1]) for s in spans]
    results = []
    for i in range(0, len(jobs), BATCH):
        results += align(engine, jobs[i : i + BATCH], options)
    return [tag_words(r.tagged_target) for r in results], [
        parse_pharaoh(r.pharaoh) for r in results
    ]


def projected(
    pairs: Sequence[tuple[str, str]], spans: list[Span], links: Sequence[set[Link]]
) -> list[tuple[int, int] | None]:
    """Hard links of another aligner through the same projection rules."""
    out = []
    for s in spans:
        source, target = pairs[s.verse]
        marked = markup.parse(tagged_source(source, s), "xml")
        weights = link_weights(links[s.verse], len(target.split()), len(marked.plain.split()))
        out.append(tag_words(project(marked, target, weights)))
    return out


def eflomal_links(data: Path, split: str) -> list[set[Link]]:
    """eflomal 2.0.0 the usual way: one run over the text of train, dev and `split`, both
    directions, grow-diag-final-and, whole words; the split's links."""
    from export.train.teacher import eflomal_gdfa

    texts = {name: read_split(data, name, "grc", "en")[0] for name in ("train", "dev", split)}
    everything = [p for name in dict.fromkeys(("train", "dev", split)) for p in texts[name]]
    links = eflomal_gdfa([s for s, _ in everything], [t for _, t in everything])
    return links[-len(texts[split]) :]


def align_part(args: argparse.Namespace) -> dict[str, Any]:
    pairs, golds = read_split(args.data, args.split, "grc", "en")
    if args.limit:
        pairs, golds = pairs[: args.limit], golds[: args.limit]
    draws = {seed: sample_spans(pairs, golds, seed) for seed in SEEDS}
    systems: dict[str, Callable[[list[Span]], Projected]] = {}
    for bundle in args.bundles:
        engine = load(bundle)
        name = Path(bundle).name
        for label, mode in (("link head", "head"), ("attention (grow)", "grow")):
            systems[f"{name} {label}"] = partial(served, engine, pairs, links=mode)
    started = time.perf_counter()
    eflomal = eflomal_links(args.data, args.split) if not args.no_eflomal else None
    eflomal_s = time.perf_counter() - started
    if eflomal is not None:
        systems["eflomal 2.0.0, grow-diag-final-and"] = lambda spans: (
            projected(pairs, spans, eflomal),
            [eflomal[s.verse] for s in spans],
        )
    rows = []
    for system, run in systems.items():
        rules, naive = [], []
        verse_links: dict[int, set[Link]] = {}
        for spans in draws.values():
            predicted, links = run(spans)
            rule, first_last = Score(), Score()
            for span, got, hard in zip(spans, predicted, links, strict=True):
                rule.add(got, span)
                first_last.add(first_to_last(hard, span), span)
                verse_links[span.verse] = hard
            rules.append(rule)
            naive.append(first_last)
        scored = sorted(verse_links)
        rows.append(
            {
                "links": system,
                "aer": aer([verse_links[v] for v in scored], [golds[v] for v in scored]),
                "spans": rules[0].spans,
                "exact": [round(r.exact_rate, 4) for r in rules],
                "word_f1": [round(r.f1_rate, 4) for r in rules],
                "first_to_last_exact": [round(r.exact_rate, 4) for r in naive],
                "first_to_last_word_f1": [round(r.f1_rate, 4) for r in naive],
            }
        )
        print(align_row(rows[-1]), flush=True)
    return {
        "split": args.split,
        "pairs": len(pairs),
        "seeds": list(SEEDS),
        "eflomal_seconds": round(eflomal_s, 1),
        "rows": rows,
    }


def _range(values: Sequence[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def align_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['links']} | {r['aer']:.3f} | {_range(r['exact'])} | {_range(r['word_f1'])} | "
        f"{_range(r['first_to_last_exact'])} | {_range(r['first_to_last_word_f1'])} |"
    )


def align_table(result: dict[str, Any]) -> str:
    lines = [
        f"Align with markup, {result['split']} ({result['pairs']} verses, one span each, "
        f"seeds {result['seeds']}: mean (min–max))",
        "",
        "| links | AER | exact span | word F1 | exact, first to last | word F1, first to last |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    return "\n".join(lines + [align_row(r) for r in result["rows"]])


# --- the translate part ---------------------------------------------------------------------------

PAIRS = ("<b>", "<i>", '<a href="https://example.org/?v=1&amp;w=2">', '<g id="7">')


def tag_verse(source: str, rng: random.Random) -> str:
    """1-3 tags in a verse: a pair of tags around 1-3 words first, then pairs, self-closing codes
    or placeholders, at random places between words (pairs do not overlap)."""
    words = [html.escape(w, quote=False) for w in source.split()]
    before: list[list[str]] = [[] for _ in range(len(words) + 1)]  # before word i, or at the end
    after: list[list[str]] = [[] for _ in words]
    taken: set[int] = set()
    for k in range(rng.randint(1, 3)):
        kind = "pair" if k == 0 else rng.choice(("pair", "code", "placeholder"))
        if kind == "pair":
            size = rng.randint(1, min(3, len(words)))
            first = rng.randrange(len(words) - size + 1)
            span = set(range(first, first + size))
            if span & taken:
                continue
            taken |= span
            opening = rng.choice(PAIRS)
            before[first].append(opening)
            after[first + size - 1].insert(0, "</" + opening[1:].split()[0].rstrip(">") + ">")
        else:
            at = rng.randrange(len(words) + 1)
            before[at].append('<x id="3"/>' if kind == "code" else rng.choice(("{0}", "%s")))
    out = []
    for i, word in enumerate(words):
        placeholders = [b for b in before[i] if not b.startswith("<")]
        tags = "".join(b for b in before[i] if b.startswith("<"))
        out += placeholders
        out.append(tags + word + "".join(after[i]))
    out += before[len(words)]
    return " ".join(out)


def tags_of(text: str) -> Counter[str]:
    return Counter(re.findall(r"<[^>]*>|\{0\}|%s", text))


def check_answer(source: str, answer: str, untagged: str) -> tuple[bool, bool, bool]:
    """Well-formed, every tag and placeholder present, the text without them the untagged one."""
    try:
        back = markup.parse(answer, "xml", (markup.NO_PROTECT,))
    except markup.MarkupError:
        return False, tags_of(answer) == tags_of(source), False
    plain = back.plain
    for placeholder in ("{0}", "%s"):
        plain = plain.replace(placeholder, " ")
    if tags_of(source) - Counter({"{0}": 99, "%s": 99}) == tags_of(source):  # no placeholder
        same = plain == untagged
    else:
        same = " ".join(plain.split()) == " ".join(untagged.split())
    return True, tags_of(answer) == tags_of(source), same


def translate_part(args: argparse.Namespace) -> dict[str, Any]:
    from service.decode.requests import in_process
    from service.decode.shared.options import SearchOptions

    pairs, _ = read_split(args.data, args.split, "grc", "en")
    pairs = pairs[: args.verses]
    rng = random.Random(args.seed)
    sources = [tag_verse(s, rng) for s, _ in pairs]
    plains = [markup.parse(s, "xml").plain for s in sources]
    engine = load(args.bundles[0])
    options = SearchOptions(**{**engine.decoding_defaults, "beam_size": 5})
    tagged_options = SearchOptions(**{**options.values(), "markup": "xml"})

    def untagged_run() -> list[str]:
        out = []
        for i in range(0, len(plains), 32):
            out += [
                t.hypotheses[0].text for t in engine.translate(plains[i : i + 32], options, "none")
            ]
        return out

    def tagged_run() -> list[str]:
        out = []
        for i in range(0, len(sources), 32):
            got = in_process.translate(engine, sources[i : i + 32], tagged_options, "none")
            out += [t.hypotheses[0].text for t in got]
        return out

    times: dict[str, list[float]] = {"untagged": [], "tagged": []}
    answers: dict[str, list[str]] = {}
    for _ in range(args.rounds):  # interleaved: both see the same machine
        for name, run in (("untagged", untagged_run), ("tagged", tagged_run)):
            started = time.perf_counter()
            answers[name] = run()
            times[name].append(time.perf_counter() - started)
    checks = [
        check_answer(s, a, u)
        for s, a, u in zip(sources, answers["tagged"], answers["untagged"], strict=True)
    ]
    n = len(sources)
    untagged_s, tagged_s = min(times["untagged"]), min(times["tagged"])
    return {
        "split": args.split,
        "bundle": str(args.bundles[0]),
        "verses": n,
        "tags": sum(sum(tags_of(s).values()) for s in sources),
        "well_formed": sum(c[0] for c in checks) / n,
        "tags_present": sum(c[1] for c in checks) / n,
        "plain_identical": sum(c[2] for c in checks) / n,
        "untagged_seconds": round(untagged_s, 2),
        "tagged_seconds": round(tagged_s, 2),
        "cost": round(tagged_s / untagged_s, 3),
        "rounds": args.rounds,
        "examples": [
            {"source": s, "answer": a, "untagged": u}
            for s, a, u in list(zip(sources, answers["tagged"], answers["untagged"], strict=True))[
                :5
            ]
        ],
    }


def translate_table(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"Translate with markup, {r['split']}: {r['verses']} verses, {r['tags']} tags and "
            f"placeholders, {r['bundle']}, beam 5, batches of 32, 1 thread (best of {r['rounds']} "
            "interleaved rounds)",
            "",
            "| well-formed | every tag present | text without tags = untagged translation | "
            "untagged s | tagged s | cost |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {r['well_formed']:.1%} | {r['tags_present']:.1%} | {r['plain_identical']:.1%} | "
            f"{r['untagged_seconds']} | {r['tagged_seconds']} | {r['cost']:.2f}× |",
        ]
    )


# --- the glossary part ----------------------------------------------------------------------------

STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "as",
        "is",
        "was",
        "were",
        "be",
        "been",
        "are",
        "am",
        "he",
        "she",
        "it",
        "they",
        "them",
        "his",
        "her",
        "its",
        "their",
        "him",
        "i",
        "you",
        "we",
        "us",
        "me",
        "my",
        "your",
        "our",
        "this",
        "that",
        "these",
        "those",
        "who",
        "whom",
        "which",
        "what",
        "not",
        "no",
        "so",
        "then",
        "there",
        "here",
        "all",
        "will",
        "would",
        "shall",
        "should",
        "do",
        "did",
        "does",
        "has",
        "have",
        "had",
        "said",
        "into",
        "out",
        "up",
    ]
)


def pick_term(
    source: str, target: str, gold: set[Link], rng: random.Random, engine: Engine
) -> tuple[str, str] | None:
    """A verse's glossary term: a source word whose gold English words are contiguous (1-3 words),
    hold a content word and can be spelled by the model's target vocabulary, drawn with the seed;
    (Greek word, English words)."""
    src, tgt = source.split(), target.split()
    candidates = []
    for s, word in enumerate(src):
        linked = sorted({t for s2, t in gold if s2 == s})
        if not linked or linked[-1] - linked[0] + 1 != len(linked) or len(linked) > 3:
            continue
        english = [tgt[t] for t in linked]
        if all(w.lower() in STOPWORDS for w in english):
            continue
        try:
            engine.terms.term_tokens(" ".join(english))
        except ValueError:  # a character its vocabulary does not have
            continue
        candidates.append((word, " ".join(english)))
    return rng.choice(candidates) if candidates else None


def contains(answer: str, term: str) -> bool:
    """The term's words in a row among the answer's (service/model/glossary.py's words)."""
    have, want = glossary.words(answer), glossary.words(term)
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def decode_each(
    engine: Engine, sources: Sequence[str], options: Sequence[Any]
) -> tuple[list[str], float]:
    """Best hypotheses, each text with its own options, in running batches of 32 sorted by length
    (as the server batches requests); seconds taken."""
    from service.decode.text.preparation import DecodeRequest

    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out = [""] * len(sources)
    started = time.perf_counter()
    for start in range(0, len(order), 32):
        idx = order[start : start + 32]
        batch = engine.new_batch(5)
        batch.add([DecodeRequest(i, engine.prepare(sources[i]), options[i], "none") for i in idx])
        while len(batch):
            for i, t in batch.step():
                out[i] = t.hypotheses[0].text
    return out, time.perf_counter() - started


def glossary_part(args: argparse.Namespace) -> dict[str, Any]:
    import sacrebleu

    from export.data import bible
    from service.decode.shared.options import SearchOptions

    pairs, golds = read_split(args.data, args.split, "grc", "en")
    rng = random.Random(args.seed)
    engine = load(args.bundles[0])
    terms = [pick_term(s, t, g, rng, engine) for (s, t), g in zip(pairs, golds, strict=True)]
    kept = [i for i, term in enumerate(terms) if term is not None]
    sources = [pairs[i][0] for i in kept]
    references = [pairs[i][1] for i in kept]
    base = SearchOptions(**{**engine.decoding_defaults, "beam_size": 5})
    plain = [base] * len(kept)
    constrained = [replace(base, glossary=(terms[i],)) for i in kept]  # type: ignore[arg-type]
    times: dict[str, list[float]] = {"without": [], "with": []}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.rounds):  # interleaved
        for name, options in (("without", plain), ("with", constrained)):
            out, seconds = decode_each(engine, sources, options)
            times[name].append(seconds)
            outputs[name] = out

    def scores(hypotheses: list[str]) -> dict[str, float]:
        stripped = [bible.strip_punctuation(h) for h in hypotheses]
        return {
            "bleu": round(sacrebleu.corpus_bleu(stripped, [references]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(stripped, [references]).score, 2),
        }

    def coverage(hypotheses: list[str]) -> float:
        found = [contains(h, terms[i][1]) for h, i in zip(hypotheses, kept, strict=True)]  # type: ignore[index]
        return round(sum(found) / len(found), 4)

    without_s, with_s = statistics.median(times["without"]), statistics.median(times["with"])
    return {
        "split": args.split,
        "bundle": str(args.bundles[0]),
        "verses": len(kept),
        "verses_without_a_term": len(pairs) - len(kept),
        "rounds": args.rounds,
        "without": {
            "seconds": round(without_s, 2),
            "term_in_answer": coverage(outputs["without"]),
            **scores(outputs["without"]),
        },
        "with": {
            "seconds": round(with_s, 2),
            "term_in_answer": coverage(outputs["with"]),
            **scores(outputs["with"]),
        },
        "cost": round(with_s / without_s, 3),
        "missed": [
            {"source": pairs[i][0], "term": terms[i], "answer": h}
            for h, i in zip(outputs["with"], kept, strict=True)
            if not contains(h, terms[i][1])  # type: ignore[index]
        ],
        "examples": [
            {"term": terms[i], "without": a, "with": b}
            for a, b, i in list(zip(outputs["without"], outputs["with"], kept, strict=True))[:5]
        ],
    }


def glossary_table(r: dict[str, Any]) -> str:
    w, c = r["without"], r["with"]
    return "\n".join(
        [
            f"Glossary, {r['split']}: {r['verses']} verses, one term each (a Greek word and its "
            f"gold English words), {r['bundle']}, beam 5, running batches of 32, 1 thread "
            f"(median of {r['rounds']} interleaved rounds)",
            "",
            "| | term in the answer | BLEU | chrF | seconds |",
            "|---|---:|---:|---:|---:|",
            f"| without the glossary | {w['term_in_answer']:.1%} | {w['bleu']} | {w['chrf']} | "
            f"{w['seconds']} |",
            f"| with it | {c['term_in_answer']:.1%} | {c['bleu']} | {c['chrf']} | "
            f"{c['seconds']} ({r['cost']:.2f}×) |",
        ]
    )


# --- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.alignment.markup", description=__doc__)
    p.add_argument("--part", choices=("align", "translate", "glossary"), default="align")
    p.add_argument("--data", type=Path, default=Path("data/grc-en"))
    p.add_argument("--split", default="dev", help="dev to choose rules, test (John) to report")
    p.add_argument("--bundles", nargs="+", default=["models/grc-en-nt", "models/grc-en-nt-silver"])
    p.add_argument("--limit", type=int, default=0, help="the first N verses only (a smoke run)")
    p.add_argument("--no-eflomal", action="store_true", help="leave eflomal's row out")
    p.add_argument("--verses", type=int, default=500, help="translate: how many verses")
    p.add_argument("--rounds", type=int, default=2, help="translate: timed rounds (best kept)")
    p.add_argument("--seed", type=int, default=1, help="translate: the tags' seed")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.part == "align":
        result = align_part(args)
        print(align_table(result))
    elif args.part == "translate":
        result = translate_part(args)
        print(translate_table(result))
    else:
        result = glossary_part(args)
        print(glossary_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
