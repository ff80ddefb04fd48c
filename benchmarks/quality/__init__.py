"""Quality: what a bundle answers through the serving engine, scored against references.

- audit: exact match and BLEU per value family, number of phrases and length, on the audit set;
- confidence: how well a hypothesis's confidence separates right answers from wrong (AUROC);
- segmentation: exact match on long inputs decoded whole and cut at the declared boundaries;
- int8: BLEU, exact match and speed of the fp32 and int8 decoder graphs side by side;
- fp16: the float16 decoder step's AER, BLEU and chrF beside float32's on John;
- grc_en_dev: choosing the Greek→English model on dev: BLEU and chrF per decoding setting;
- g2p_en: the G2P bundle against g2p_en's predictor: accuracy and words/s;
- g2p_common: common English words through the G2P model, with and without its memory;
- answers_digest: every embedded bundle's s2s-translate answers and the Greek models' served ones,
  as bytes, before and after a change that says it keeps them;
- sentence_splitters: sentence splitting libraries and the served splitter on real sentence
  boundaries (en, fr, de, grc): boundary precision, recall, F1 and speed.
"""
