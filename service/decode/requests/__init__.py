"""The request's path around the engine: markup taken out and put back (marked.py), a model's memory
consulted before the model (recall.py).

May import every room below it (align, engine, text, search, runtime, shared).
"""
