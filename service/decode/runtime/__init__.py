"""ONNX Runtime: a bundle's sessions and their runs (runtime.py), the device and its copies (device.py,
transfers.py), the execution providers (providers.py), and the graphs built or rewritten at load:
the search's step (search_graph.py), the caches in place (cache_in_place.py), the top k in two
stages (blocked_topk.py), the encoder's keys per layer (encoder_layers.py), Align's choice of
attention (attention_choice.py), small row graphs (graph_bytes.py); the link head's graph and its
lexicon (link_head.py, lexicon.py).

Imports shared only (and service.model).
"""
