"""The model configurations the benchmarks share (torch-free: the GPU benchmark imports it anywhere)."""

from __future__ import annotations

from service.model.architecture import ModelConfig

# The "realistic" configuration: an RNN NMT model of the size people serve (V 8k, E 256, H 512).
REALISTIC = ModelConfig(
    src_vocab_size=8000,
    tgt_vocab_size=8000,
    emb_dim=256,
    enc_hidden=256,
    dec_hidden=512,
    attn_dim=256,
    dropout=0.0,
)
