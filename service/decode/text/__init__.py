"""A text's sides of a decode: made ready for the model (preparation.py, sides.py), its glossary terms
(terms.py), and its answer built from search results (results.py, translation.py).

Imports shared only: it never runs a graph, so a front can use it without ONNX Runtime's sessions.
"""
