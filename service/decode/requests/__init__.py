"""The request's path around the engine, once: pipeline.py runs it (markup out → prepared → the
memory's plan → decode and forced pass → answers → markup back) over a `Decoding` (the server's
engines, or in_process.py's engine in this process), whole or streamed sentence by sentence; its
steps' concepts are marked.py (markup taken out and put back), documents.py (texts cut into
sentences and their answers joined) and recall.py (a model's memory consulted before the model).

May import every room below it (align, engine, text, search, runtime, shared); pipeline.py,
marked.py, documents.py and recall.py only what a front process holds (no ONNX Runtime: tests/test_layering.py).
"""
