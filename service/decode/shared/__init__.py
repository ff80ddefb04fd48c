"""What every room of service/decode reads: the decoding options and their rules (options.py, rules.py,
controls.py, constraints.py), the types the searches and decoders exchange (search_types.py), the
decoder's settings (config.py), the errors a request can meet (errors.py), and the alignment
matrices' helpers (alignment.py).

Imports nothing of service/decode (only service.model).
"""
