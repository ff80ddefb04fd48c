"""The engine: text in, hypotheses with alignments out (engine.py), the encoder rows it keeps for the
link head (kept_rows.py), and the encoder run ahead of the decode loop (encode_ahead.py).

Imports text, search, runtime and shared; never align or requests.
"""
