"""Silver links: where a corpus has no gold word alignments, eflomal's links take their place.

The config's `[alignment]` table says where the links of guided alignment and of the link head
come from:

    [alignment]
    teacher = "eflomal"   # "gold": the [corpus] alignment files; "auto" (the default): gold where
                          # [corpus] names alignment files, else eflomal when the run needs links
                          # (optim.guided_alignment > 0 or a [link_head] table)

With eflomal (the PyPI package, Östling and Tiedemann 2016) every pair of every split the run reads
is aligned at once, in both directions, over lower-cased, accent-stripped words (compared by their
first letters with `source_prefix_len`/`target_prefix_len`), and the two directions are symmetrized
with grow-diag-final-and (export/metrics/symmetrize.py). eflomal samples: with `runs` > 1 it runs
that many times and a link stays where `min_votes` runs hold it. Then, with `attach_unaligned`, each
target word still unaligned joins the source words of its nearest aligned neighbour, as people link
function words ("he will come" to one verb) where an IBM-model aligner leaves them to NULL. No gold
file is opened: each split is read as text only (its `alignments` left out), written to
`<out>/data/<split>.{src,tgt}` with its links beside it in `<split>.eflomal.pharaoh` (and each
direction's in `<split>.eflomal-fwd.pharaoh`, `-rev.pharaoh`), and the run
then reads those as its corpus, so guided alignment and the link head do not know which links they
got. The test split keeps no links (its silver links are not gold to score against). The links are
kept, with the settings and a hash of the text in `<out>/data/eflomal.json`: a rerun over the same
text and settings (--resume, --skip-train) reuses them instead of sampling new ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from export.data.parallel import CorpusConfig, SplitSpec, load_split
from export.metrics.aer import parse_pharaoh
from export.metrics.symmetrize import attach_unaligned_targets, grow_diag_final_and

Link = tuple[int, int]
TEACHERS = ("auto", "gold", "eflomal")
ATTACH = ("none", "right", "left")
SETTINGS_FILE = "eflomal.json"


@dataclass(frozen=True)
class AlignmentConfig:
    """The `[alignment]` table: the links' source and eflomal's settings (its own defaults)."""

    teacher: str = "auto"
    model: int = 3  # eflomal's model: 1 IBM1, 2 + HMM, 3 + fertility
    n_samplers: int = 3
    null_prior: float = 0.2
    # eflomal compares words by their first N letters where N > 0 (inflected languages), else whole
    source_prefix_len: int = 0
    target_prefix_len: int = 0
    threads: int = 1  # OMP_NUM_THREADS of the eflomal binary
    # eflomal samples, so runs differ: with runs > 1 a link is kept where at least min_votes of the
    # runs' symmetrized links (and, for each direction, of its links) hold it
    runs: int = 1
    min_votes: int = 1
    # "right"/"left": a target word left unaligned joins the source words of the nearest aligned
    # target word, looking that way first (export/metrics/symmetrize.py); "none": left unaligned
    attach_unaligned: str = "none"

    def __post_init__(self) -> None:
        if self.teacher not in TEACHERS:
            raise ValueError(f"[alignment] teacher must be one of {TEACHERS}, got {self.teacher!r}")
        if self.runs < 1 or not 1 <= self.min_votes <= self.runs:
            raise ValueError(
                f"[alignment] needs runs >= 1 and 1 <= min_votes <= runs, got runs = {self.runs}, "
                f"min_votes = {self.min_votes}"
            )
        if self.attach_unaligned not in ATTACH:
            raise ValueError(
                f"[alignment] attach_unaligned must be one of {ATTACH}, "
                f"got {self.attach_unaligned!r}"
            )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AlignmentConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"[alignment] has unknown keys {unknown} (known: {sorted(known)})")
        return cls(**raw)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> AlignmentConfig:
        """The eflomal teacher a links_source record (`eflomal_settings` and what the run added:
        version, pairs, seconds) describes; the thread count is not recorded."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})

    def eflomal_settings(self) -> dict[str, Any]:
        """What the manifest records as the links' source."""
        from importlib.metadata import version

        return {
            "teacher": "eflomal",
            "eflomal_version": version("eflomal"),
            "model": self.model,
            "n_samplers": self.n_samplers,
            "null_prior": self.null_prior,
            "source_prefix_len": self.source_prefix_len,
            "target_prefix_len": self.target_prefix_len,
            "directions": "both, symmetrized with grow-diag-final-and",
            "words": "lower-cased, accents stripped",
            "runs": self.runs,
            "min_votes": self.min_votes,
            "attach_unaligned": self.attach_unaligned,
        }


def resolve_teacher(cfg: AlignmentConfig, corpus: CorpusConfig, needs_links: bool) -> str:
    """ "gold" or "eflomal": "auto" is gold when a split names alignment files, else eflomal when
    the run needs links, else gold (no links at all)."""
    if cfg.teacher != "auto":
        return cfg.teacher
    has_gold = any(s.alignments is not None for s in corpus.splits.values())
    return "eflomal" if needs_links and not has_gold else "gold"


def fold(text: str) -> str:
    """The form eflomal compares words in: lower-cased, combining accents dropped."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def eflomal_directions(
    sources: Sequence[str], targets: Sequence[str], cfg: AlignmentConfig | None = None
) -> tuple[list[set[Link]], list[set[Link]]]:
    """eflomal's forward and reverse links (both as (source, target)) of every pair, folded."""
    from eflomal import Aligner

    cfg = cfg or AlignmentConfig()
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
    try:
        with tempfile.TemporaryDirectory(prefix="eflomal-") as tmp:
            fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
            aligner = Aligner(
                model=cfg.model,
                n_samplers=cfg.n_samplers,
                null_prior=cfg.null_prior,
                source_prefix_len=cfg.source_prefix_len,
                target_prefix_len=cfg.target_prefix_len,
            )
            aligner.align(
                [fold(s) for s in sources],
                [fold(t) for t in targets],
                links_filename_fwd=str(fwd),
                links_filename_rev=str(rev),
                quiet=True,
            )
            forward = [parse_pharaoh(x) for x in fwd.read_text(encoding="utf-8").splitlines()]
            reverse = [parse_pharaoh(x) for x in rev.read_text(encoding="utf-8").splitlines()]
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    if len(forward) != len(sources) or len(reverse) != len(sources):
        raise RuntimeError(
            f"eflomal wrote {len(forward)} and {len(reverse)} lines for {len(sources)} pairs"
        )
    return forward, reverse


def eflomal_gdfa(
    sources: Sequence[str], targets: Sequence[str], cfg: AlignmentConfig | None = None
) -> list[set[Link]]:
    """eflomal both ways, symmetrized with grow-diag-final-and."""
    forward, reverse = eflomal_directions(sources, targets, cfg)
    return [grow_diag_final_and(f, r) for f, r in zip(forward, reverse, strict=True)]


def vote(runs: Sequence[Sequence[set[Link]]], min_votes: int) -> list[set[Link]]:
    """Per pair, the links that at least min_votes of the runs hold."""
    kept = []
    for per_run in zip(*runs, strict=True):
        counts = Counter(link for links in per_run for link in links)
        kept.append({link for link, n in counts.items() if n >= min_votes})
    return kept


def silver_links(
    sources: Sequence[str],
    targets: Sequence[str],
    cfg: AlignmentConfig,
    say: Callable[[str], Any] = print,
) -> tuple[list[set[Link]], list[set[Link]], list[set[Link]]]:
    """The teacher's links of every pair, then its forward and reverse links: cfg.runs eflomal
    runs, each symmetrized with grow-diag-final-and, kept where min_votes runs agree, and the
    target words left unaligned attached as cfg.attach_unaligned says."""
    forwards, reverses, symmetrized = [], [], []
    for run in range(cfg.runs):
        if cfg.runs > 1:
            say(f"teacher eflomal: run {run + 1} of {cfg.runs}")
        forward, reverse = eflomal_directions(sources, targets, cfg)
        forwards.append(forward)
        reverses.append(reverse)
        symmetrized.append(
            [grow_diag_final_and(f, r) for f, r in zip(forward, reverse, strict=True)]
        )
    links = vote(symmetrized, cfg.min_votes)
    if cfg.attach_unaligned != "none":
        links = [
            attach_unaligned_targets(x, len(t.split()), cfg.attach_unaligned)
            for x, t in zip(links, targets, strict=True)
        ]
    return links, vote(forwards, cfg.min_votes), vote(reverses, cfg.min_votes)


def pharaoh_line(links: set[Link] | list[Link]) -> str:
    return " ".join(f"{s}-{t}" for s, t in sorted(links))


def _digest(pairs: Sequence[tuple[str, str]], settings: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for s, t in pairs:
        h.update(f"{s}\t{t}\n".encode())
    return h.hexdigest()


def silver_corpus(
    corpus: CorpusConfig, cfg: AlignmentConfig, out: Path, say: Callable[[str], Any] = print
) -> tuple[CorpusConfig, dict[str, Any]]:
    """The corpus with eflomal's links in place of gold: every split read as text only, all pairs
    aligned at once, written under out/data (see the module's docstring). Returns the corpus
    config that names those files and the links' source (settings, pairs, seconds)."""
    text = {
        name: load_split(replace(spec, alignments=None)) for name, spec in corpus.splits.items()
    }
    for name, spec in corpus.splits.items():
        if spec.alignments is not None:
            say(f"teacher eflomal: {spec.alignments} ([corpus.{name}]'s gold links) is not read")
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    order = list(text)
    pairs = [p for name in order for p in text[name].pairs]
    settings = asdict(cfg) | {"teacher": "eflomal"}
    settings.pop("threads")
    digest = _digest(pairs, settings)
    record_path = data / SETTINGS_FILE
    record: dict[str, Any] = {}
    if record_path.is_file():
        record = json.loads(record_path.read_text(encoding="utf-8"))
    paths = {n: data / f"{n}.eflomal.pharaoh" for n in order}
    every = [q for p in paths.values() for q in (p, *directional_paths(p))]
    if record.get("sha256") == digest and all(p.is_file() for p in every):
        say(f"teacher eflomal: reusing the links in {data} (same text and settings)")
    else:
        say(f"teacher eflomal: aligning {len(pairs)} pairs, both directions (1 thread)...")
        start = time.monotonic()
        links, forward, reverse = silver_links(
            [s for s, _ in pairs], [t for _, t in pairs], cfg, say
        )
        seconds = round(time.monotonic() - start, 1)
        at = 0
        for name in order:
            n = len(text[name].pairs)
            for path, each in zip(
                (paths[name], *directional_paths(paths[name])),
                (links, forward, reverse),
                strict=True,
            ):
                path.write_text("".join(pharaoh_line(x) + "\n" for x in each[at : at + n]))
            at += n
            _write_text(data, name, text[name].pairs)
        record = {
            **cfg.eflomal_settings(),
            "sha256": digest,
            "pairs": len(pairs),
            "seconds": seconds,
        }
        record_path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        say(f"teacher eflomal: {len(pairs)} pairs aligned in {seconds} s; links in {data}")
    splits = {
        name: SplitSpec(
            name=name,
            source=data / f"{name}.src",
            target=data / f"{name}.tgt",
            alignments=paths[name] if name != "test" else None,
        )
        for name in order
    }
    source = {k: v for k, v in record.items() if k != "sha256"}
    return CorpusConfig(splits=splits), source


def directional_paths(links: Path) -> tuple[Path, Path]:
    """The forward and reverse links written beside a symmetrized file: train.eflomal.pharaoh →
    train.eflomal-fwd.pharaoh, train.eflomal-rev.pharaoh (both source-target)."""
    stem = links.name.removesuffix(".eflomal.pharaoh")
    return links.with_name(f"{stem}.eflomal-fwd.pharaoh"), links.with_name(
        f"{stem}.eflomal-rev.pharaoh"
    )


def _write_text(data: Path, name: str, pairs: Sequence[tuple[str, str]]) -> None:
    for suffix, side in (("src", 0), ("tgt", 1)):
        (data / f"{name}.{suffix}").write_text(
            "".join(p[side] + "\n" for p in pairs), encoding="utf-8"
        )


def links_source(
    cfg: CorpusConfig, teacher: str, settings: dict[str, Any] | None
) -> dict[str, Any]:
    """The manifest's record of where the links came from."""
    if teacher == "eflomal":
        return dict(settings or {})
    return recorded_source(cfg.splits["train"].alignments)


def recorded_source(alignments: Path | None) -> dict[str, Any]:
    """Where an alignment file's links came from: the record the teacher wrote beside it (a
    `<split>.eflomal.pharaoh` with SETTINGS_FILE), else gold."""
    if alignments is not None and alignments.name.endswith(".eflomal.pharaoh"):
        record_path = alignments.with_name(SETTINGS_FILE)
        if record_path.is_file():
            record = json.loads(record_path.read_text(encoding="utf-8"))
            return {k: v for k, v in record.items() if k != "sha256"}
    return {"teacher": "gold", "file": str(alignments) if alignments else None}
