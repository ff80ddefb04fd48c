"""Forced-decoding alignment figures of the default model on the test split, by phrase count."""
import torch
from export.alignment_eval import evaluate_alignments
from export.checkpoint import load_checkpoint
from export.corpus import read_tsv
from export.gold import read_gold
from service.tokenizer import Tokenizer

torch.set_num_threads(1)
model, _ = load_checkpoint("models/default.pt")
src, tgt = Tokenizer.load("models/default/source.model"), Tokenizer.load("models/default/target.model")
pairs, gold = read_tsv("docs/eval/test.tsv"), read_gold("docs/eval/test.gold.jsonl")
for name, keep in (("1-3 phrases (trained)", lambda g: g.parts <= 3), ("4+ phrases (beyond)", lambda g: g.parts > 3)):
    idx = [i for i, g in enumerate(gold) if keep(g)]
    r = evaluate_alignments(model, src, tgt, [pairs[i] for i in idx], [gold[i] for i in idx])
    o = r["overall"] if "overall" in r else r
    print(name, len(idx), {k: o.get(k) for k in ("phrase_accuracy", "word_accuracy", "aer", "off_by_plus_one", "off_by_minus_one")})
