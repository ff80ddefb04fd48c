"""Alignment: forced alignment against gold links, the link head's cost, and markup put back.

- align_modes: `Align`'s AER, precision and recall per link mode against gold word alignments;
- grc_en: the Greek→English model on John against Biblica's manual alignments (AER per link mode,
  BLEU and chrF, pairs/s), beside the baselines of grc_en_baselines (eflomal, a translation memory);
- grc_en_silver: the silver bundle (trained without gold) against eflomal and the gold bundle;
- link_head: what a bundle's link head costs, beside another head on the same model;
- markup: what the alignments are for (tags put back, Translate with markup, glossaries), on the
  Greek New Testament;
- markup_cli, markup_served: Translate with markup as a user runs it (`s2s-translate`) and as the
  server answers it, against the same texts untagged.
"""
