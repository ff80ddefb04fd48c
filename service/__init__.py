"""The serving runtime: bundle, ONNX Runtime, beam search, engine, scheduler, server. Never imports torch."""
