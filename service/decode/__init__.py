"""Decoding: a bundle's graphs run as a batched beam search, and what a request needs around it.

Rooms, top to bottom; each imports only the rooms below it (pyproject.toml's import-linter contract
"decode rooms" keeps it):

    requests   markup and the memory around the engine
    align      Align's forced pass, hard links, markup projected back
    engine     text in, hypotheses with alignments out; the encoder run ahead
    text       | search    (siblings: neither imports the other)
    runtime    ONNX Runtime sessions, the device, the graphs built at load
    shared     options, rules, controls, the exchanged types, settings, errors
"""
