"""GPU figures (each runs anywhere; the CUDA rows need onnxruntime-gpu and a GPU).

- gpu_check: check a GPU host and measure it in one go (scripts/gpu_check.sh runs it): providers,
  placement, the CUDA tests, decode_loop and serving.served;
- decode_loop: the decode loop against batch size on every execution provider, static and churning
  batches, bytes per step (the transfer ledger's, and cuda_copy_counter.c's count of the CUDA
  runtime's own copies where it is preloaded);
- placement: which provider ran each node of a bundle's graphs, and the Memcpy nodes inserted.
"""
