"""Training, evaluation and ONNX export (needs torch: `pip install .[train]`)."""
