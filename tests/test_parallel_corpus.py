"""Training on a user's plain-text parallel corpus (export/data/parallel.py, export/pipeline.py):
every corpus error names its file and line; a tiny corpus trains, exports, passes the parity check,
is served by the Engine and its word alignments are over the client's whitespace words; --resume
continues a run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from export import pipeline
from export.data import corpus
from export.data.parallel import (
    CorpusConfig,
    CorpusError,
    SplitSpec,
    load_split,
    parse_line_ranges,
    parse_pharaoh,
    read_lines,
)
from export.data.tokenizer import train_joint_tokenizer
from export.onnx.parity import ParityError, check_parity
from export.train.checkpoint import load_checkpoint, load_training_state
from export.train.data import encode_pairs
from export.train.train import TrainConfig
from service.decode.engine.engine import Engine
from service.decode.shared.config import RuntimeConfig
from service.decode.shared.options import SearchOptions
from service.model.tokenizer import Tokenizer

# --- a toy language pair: adjective-noun pairs swap order, every word has one translation ---------

NOUNS = {"kat": "cat", "dom": "house", "vel": "dog", "ruk": "tree", "mar": "sea", "tol": "bird"}
ADJS = {"bo": "big", "mi": "small", "ra": "red", "zu": "old"}
VERBS = {"sena": "sees", "lupa": "likes", "dara": "finds"}


def toy_pair(rng: random.Random) -> tuple[str, str, str]:
    """(source, target, pharaoh): `[noun adj] verb [noun adj]` → `[adj noun] verb [adj noun]`."""
    src: list[str] = []
    tgt: list[str] = []
    links: list[str] = []

    def phrase() -> None:
        noun = rng.choice(sorted(NOUNS))
        if rng.random() < 0.6:
            adj = rng.choice(sorted(ADJS))
            s0, t0 = len(src), len(tgt)
            src.extend([noun, adj])
            tgt.extend(["the", ADJS[adj], NOUNS[noun]])
            links.extend([f"{s0}-{t0 + 2}", f"{s0 + 1}-{t0 + 1}"])
        else:
            links.append(f"{len(src)}-{len(tgt) + 1}")
            src.append(noun)
            tgt.extend(["the", NOUNS[noun]])

    phrase()
    verb = rng.choice(sorted(VERBS))
    links.append(f"{len(src)}-{len(tgt)}")
    src.append(verb)
    tgt.append(VERBS[verb])
    phrase()
    return " ".join(src), " ".join(tgt), " ".join(links)


def write_corpus(folder: Path, n: int, seed: int = 3) -> tuple[Path, Path, Path]:
    rng = random.Random(seed)
    rows = [toy_pair(rng) for _ in range(n)]
    paths = folder / "all.src", folder / "all.tgt", folder / "all.pharaoh"
    for path, column in zip(paths, zip(*rows, strict=True), strict=True):
        path.write_text("\n".join(column) + "\n", encoding="utf-8")
    return paths


def write_files(folder: Path, **files: str) -> dict[str, Path]:
    out = {}
    for name, text in files.items():
        out[name] = folder / name
        out[name].write_bytes(text.encode("utf-8"))
    return out


# --- reading and checking ----------------------------------------------------------------------


def spec(paths: dict[str, Path], lines: str | None = None) -> SplitSpec:
    return SplitSpec(
        "train",
        paths["src"],
        paths["tgt"],
        paths.get("al"),
        parse_line_ranges(lines) if lines else None,
    )


def test_reads_pairs_links_and_counts_what_it_skips(tmp_path: Path) -> None:
    paths = write_files(
        tmp_path,
        src="a  b\n\nc d e\r\nf\n",
        tgt="x y\n\nz\r\nw v\n",
        al="0-1 1-0\n\n\n0-0 0-1\n",
    )
    split = load_split(spec(paths))
    assert split.pairs == [("a b", "x y"), ("c d e", "z"), ("f", "w v")]  # blank line 2 skipped
    assert split.gold == [[(0, 1), (1, 0)], None, [(0, 0), (0, 1)]]
    r = split.report
    assert (r.pairs, r.blank_skipped, r.guided, r.unguided) == (3, 1, 2, 1)
    assert "1 lines blank on both sides skipped" in r.line()


def test_line_ranges_select_lines(tmp_path: Path) -> None:
    paths = write_files(tmp_path, src="a\nb\nc\nd\n", tgt="1\n2\n3\n4\n")
    split = load_split(spec(paths, "1, 3-4"))
    assert split.pairs == [("a", "1"), ("c", "3"), ("d", "4")]
    with pytest.raises(CorpusError, match=r"lines go up to 9 but .*src has 4 lines"):
        load_split(spec(paths, "2-9"))
    with pytest.raises(CorpusError, match="first <= last"):
        parse_line_ranges("5-2")


def test_different_line_counts_name_both_files(tmp_path: Path) -> None:
    paths = write_files(tmp_path, src="a\nb\nc\n", tgt="x\ny\n")
    with pytest.raises(CorpusError, match=r"src has 3 lines but .*tgt has 2"):
        load_split(spec(paths))


def test_alignment_file_with_other_line_count(tmp_path: Path) -> None:
    paths = write_files(tmp_path, src="a\nb\n", tgt="x\ny\n", al="0-0\n")
    with pytest.raises(CorpusError, match=r"src has 2 lines but .*al has 1"):
        load_split(spec(paths))


@pytest.mark.parametrize(
    ("src", "tgt", "empty", "line"), [("a\n\n", "x\ny\n", "src", 2), ("a\nb\n", "x\n \n", "tgt", 2)]
)
def test_empty_line_on_one_side_names_file_and_line(
    tmp_path: Path, src: str, tgt: str, empty: str, line: int
) -> None:
    paths = write_files(tmp_path, src=src, tgt=tgt)
    with pytest.raises(CorpusError, match=rf"{empty}:{line}: empty line, but line {line} of"):
        load_split(spec(paths))


def test_alignment_out_of_range_names_file_and_line(tmp_path: Path) -> None:
    paths = write_files(tmp_path, src="a b\nc d\n", tgt="x\ny z\n", al="0-0\n1-1 2-0\n")
    with pytest.raises(
        CorpusError, match=r"al:2: link 2-0 is out of range: the source has 2 words"
    ):
        load_split(spec(paths))
    with pytest.raises(CorpusError, match=r"here: 'x-1' is not a Pharaoh link"):
        parse_pharaoh("0-0 x-1", 2, 2, "here")
    assert parse_pharaoh("1-0 0p1 1-0", 2, 2, "here") == [(0, 1), (1, 0)]


def test_text_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes("one\ntwo\ncaf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin1.txt:3: not UTF-8 \(byte 0xe9 at byte 4"):
        read_lines(tmp_path / "latin1.txt")
    with pytest.raises(CorpusError, match=r"cannot read .*missing\.txt"):
        read_lines(tmp_path / "missing.txt")


def test_corpus_table_shares_files_and_rejects_unknown_keys(tmp_path: Path) -> None:
    cfg = CorpusConfig.from_dict(
        {"source": "s", "target": "t", "train": {"lines": "1-8"}, "dev": {"lines": "9-10"}}
    )
    assert cfg.splits["dev"].source == Path("s") and cfg.splits["dev"].lines == ((9, 10),)
    with pytest.raises(CorpusError, match="unknown keys"):
        CorpusConfig.from_dict({"source": "s", "target": "t", "train": {}, "sauce": 1})
    with pytest.raises(CorpusError, match="no target file"):
        CorpusConfig.from_dict({"source": "s", "train": {}})
    with pytest.raises(CorpusError, match=r"no \[corpus.train\]"):
        CorpusConfig.from_dict({"source": "s", "target": "t"})


def test_joint_tokenizer_is_one_model_for_both_sides(tmp_path: Path) -> None:
    src, tgt, _ = write_corpus(tmp_path, 200)
    pairs = list(zip(read_lines(src), read_lines(tgt), strict=True))
    s_path, t_path = train_joint_tokenizer(pairs, tmp_path / "tok", 60)
    assert s_path.read_bytes() == t_path.read_bytes()


# --- the whole path on a tiny corpus -----------------------------------------------------------

TOY_CONFIG = """
[model]
emb_dim = 24
enc_hidden = 24
dec_hidden = 48
attn_dim = 24
decoder_style = "{style}"
rnn = "{rnn}"
attention = "{attention}"
dropout = 0.0

[data]
src_vocab = 40
tgt_vocab = 40

[corpus]
source = "{src}"
target = "{tgt}"
alignments = "{al}"
[corpus.train]
lines = "1-400"
[corpus.dev]
lines = "401-420"
[corpus.test]
lines = "421-440"

[optim]
lr = 0.01
max_tokens = 600
max_steps = {steps}
max_minutes = 5
eval_every = 40
patience = 10
threads = 1
guided_alignment = 0.5

[bundle]
name = "toy"
version = "0.0.1"
"""


def toy_config(
    folder: Path, steps: int, style: str = "cgru", rnn: str = "gru", attention: str = "additive"
) -> Path:
    src, tgt, al = write_corpus(folder, 440)
    path = folder / "toy.toml"
    text = TOY_CONFIG.format(
        src=src, tgt=tgt, al=al, steps=steps, style=style, rnn=rnn, attention=attention
    )
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toy")
    config = toy_config(folder, steps=160)
    assert pipeline.main(["--config", str(config), "--out", str(folder / "run")]) == 0
    return folder / "run"


def test_pipeline_trains_exports_checks_and_evaluates(toy_run: Path) -> None:
    figures = json.loads((toy_run / "pipeline.json").read_text())
    assert figures["parity"]["max_log_prob_diff"] < 1e-3
    assert figures["test_served"]["sentences"] == 20
    assert figures["test_served"]["bleu"] > 50  # a word-for-word toy language is learnable
    manifest = json.loads((toy_run / "bundle" / "manifest.json").read_text())
    assert (manifest["name"], manifest["version"]) == ("toy", "0.0.1")
    assert manifest["info"]["test"]["bleu"] == figures["test_served"]["bleu"]
    log = [json.loads(line) for line in (toy_run / "train_log.jsonl").read_text().splitlines()]
    evals = [e for e in log if "dev_bleu" in e]
    assert [e["step"] for e in evals] == [40, 80, 120, 160]
    assert all({"train_loss", "minutes_left", "epoch"} <= set(e) for e in evals)
    assert log[-1]["ended_by"] == "max_steps"


def test_served_word_alignment_is_over_whitespace_words(toy_run: Path) -> None:
    engine = Engine.load(toy_run / "bundle", RuntimeConfig(providers=("CPUExecutionProvider",)))
    # unknown letters (K, ö) become <unk> pieces; the words reported are still the client's
    texts = ["kat bo sena dom", "vel   lupa ruk mi", "mar zu dara tol ra", "Kat bo sena döm"]
    out = engine.translate(texts, SearchOptions(beam_size=3), alignment="word")
    for text, translation in zip(texts, out, strict=True):
        hyp = translation.hypotheses[0]
        assert hyp.alignment is not None
        matrix = hyp.alignment.matrix  # (T', S')
        assert matrix.shape == (len(hyp.text.split()), len(text.split()))
        assert hyp.alignment.source_tokens == text.split()
        assert np.allclose(matrix.sum(axis=1), 1.0, atol=1e-4)


def test_guided_attention_finds_the_swapped_words(toy_run: Path) -> None:
    """The attention argmax on the test split agrees with most gold links (AER from s2s-evaluate)."""
    metrics = json.loads((toy_run / "eval" / "metrics.json").read_text())
    assert metrics["alignment"]["aer"] < 0.3


def test_resume_continues_the_step_count_and_optimizer(tmp_path: Path) -> None:
    config = toy_config(tmp_path, steps=40)
    out = tmp_path / "run"
    assert pipeline.main(["--config", str(config), "--out", str(out)]) == 0  # no [bundle] needed
    first = load_training_state(out / "last.pt")
    assert first.progress["step"] == 40 and first.optimizer["state"]
    text = config.read_text().replace("max_steps = 40", "max_steps = 80")
    config.write_text(text)
    assert pipeline.main(["--config", str(config), "--out", str(out), "--resume"]) == 0
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "dev_bleu" in e] == [40, 80]  # one log across both runs
    assert load_training_state(out / "last.pt").progress["step"] == 80
    _, meta = load_checkpoint(out / "best.pt")
    assert meta["last_step"] == 80


@pytest.mark.parametrize(
    ("style", "rnn", "attention"), [("luong", "lstm", "general"), ("bahdanau", "gru", "none")]
)
def test_other_architectures_train_through_the_corpus_path(
    tmp_path: Path, style: str, rnn: str, attention: str
) -> None:
    config = toy_config(tmp_path, steps=10, style=style, rnn=rnn, attention=attention)
    text = config.read_text().replace("guided_alignment = 0.5", "guided_alignment = 0.0")
    config.write_text(text.replace("[bundle]", "[unused]").split("[unused]")[0])
    out = tmp_path / "run"
    assert pipeline.main(["--config", str(config), "--out", str(out)]) == 0
    model, _ = load_checkpoint(out / "best.pt")
    assert (model.cfg.decoder_style, model.cfg.rnn, model.cfg.attention) == (style, rnn, attention)


def test_resume_without_a_run_is_a_clear_error(tmp_path: Path) -> None:
    config = toy_config(tmp_path, steps=40)
    with pytest.raises(ValueError, match=r"no .*last\.pt to continue from"):
        pipeline.main(["--config", str(config), "--out", str(tmp_path / "none"), "--resume"])


def test_bad_corpus_stops_the_command_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = toy_config(tmp_path, steps=40)
    al = tmp_path / "all.pharaoh"
    lines = al.read_text().splitlines()
    lines[6] = "0-0 9-9"
    al.write_text("\n".join(lines) + "\n")
    assert pipeline.main(["--config", str(config), "--out", str(tmp_path / "run")]) == 2
    assert "all.pharaoh:7: link 9-9 is out of range" in capsys.readouterr().err


def test_config_needs_a_dev_split(tmp_path: Path) -> None:
    config = toy_config(tmp_path, steps=40)
    config.write_text(config.read_text().replace("[corpus.dev]", "[corpus.extra]"))
    with pytest.raises(CorpusError, match="unknown keys"):
        TrainConfig.load(config)


def test_parity_check_catches_graphs_that_differ_from_the_model(toy_run: Path) -> None:
    model, _ = load_checkpoint(toy_run / "best.pt")
    src_tok = Tokenizer.load(toy_run / "source.model")
    tgt_tok = Tokenizer.load(toy_run / "target.model")
    pairs = corpus.read_tsv(toy_run / "data" / "dev.tsv")[:8]
    examples = encode_pairs(pairs, src_tok, tgt_tok)
    report = check_parity(model, toy_run / "bundle", examples)
    assert report.sentences == 8 and report.max_log_prob_diff < 1e-3
    with torch.no_grad():
        model.out.bias[5] += 0.5  # the PyTorch model no longer matches the exported graphs
    with pytest.raises(ParityError, match="differ from the PyTorch model"):
        check_parity(model, toy_run / "bundle", examples)
