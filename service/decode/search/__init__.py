"""The beam searches of a running batch: the host's readable reference (beam.py), the device's graph
run a step (device_search.py, with its tensors' places in search_memory.py), one protocol over both
(search.py).

Imports runtime (sessions, the device) and shared; never text, engine, align or requests.
"""
