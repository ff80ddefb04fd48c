"""Figures measured side by side: scripts that print what they measure (`python -m
benchmarks.GROUP.MODULE --help`), not tests. Their outputs live in docs/benchmarks/.

Grouped by subject, each group's docstring saying what its modules measure:

- decoding/: one engine's decode speed, the search's host cost, the stopping rules and controls;
- serving/: whole servers and their parts under load (the decode loop, fronts, the channels,
  layouts, memory, the two faces' encoding);
- alignment/: forced alignment against gold links, the link head, markup put back by alignment;
- quality/: what a bundle answers (exact match, BLEU, AUROC, accuracy), fp32 beside int8 and fp16;
- importing/: imported models beside the toolkits that trained them, on the same weights;
- gpu/: a GPU host's check, the decode loop per provider and batch size, node placement.

Shared: configs.py (the realistic model configuration) and sample_texts.py (each bundle's texts).
"""
