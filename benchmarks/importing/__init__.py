"""Imported models (s2s-import) beside the toolkits that trained them, on the same weights.

- import_speed: decode-only throughput against OpenNMT-py and Joey NMT;
- import_bible_table: our Greek→English model beside the same split's OpenNMT-py and Joey NMT
  models, imported: quality and speed on John in one table;
- marian_side_by_side: Marian's s2s models beside their import: fidelity, quality and speed;
- onmt_controls_john: the decoding controls against onmt_translate's, verse by verse on John;
- transformer_speed: a Transformer (Hugging Face's MarianMTModel, OPUS-MT's shape or a small one)
  imported beside CTranslate2 converted from the same weights, and transformers' generate: target
  tokens per second, float32 and int8, at 1 and 2 threads;
- step_cost: where a small Transformer's decoding step goes beside CTranslate2's: time a step on
  a sentence that runs to the maximum length, ours split into ONNX Runtime's Run and the rest, and
  the step graph alone with its axes dynamic and fixed;
- optimum_row: Optimum's ORTModelForSeq2SeqLM.generate on the same directory, in a venv of its
  own (optimum-onnx needs an older transformers): transformer_speed's Optimum row;
- transformer_speed_marian: a Marian Transformer of OPUS-MT's shape made by Marian, imported,
  beside CTranslate2 converted by its Marian converter and marian-decoder, on the same weights;
- transformer_exact: a Hugging Face MarianMTModel made here beside its import on held-out texts:
  best translations, n-best lists, scores and attention against generate's;
- transformer_exact_marian: a Marian Transformer (trained here, or given) beside its import on
  held-out texts: n-best lists, scores, soft and hard alignments against marian-decoder's;
- transformer_offline: the embedded Transformer offline beside CTranslate2 on the same weights
  and texts, at 1 and 2 threads;
- bundle_to_marian: a Transformer bundle written back as a Marian model (npz and vocabularies),
  checked weight by weight, and converted to CTranslate2 by its Marian converter;
- compare_bundles: two bundles of one model (an export change, a re-import): the same outputs, and
  which decodes faster.
"""
