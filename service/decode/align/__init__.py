"""Align: the teacher-forced pass over given (source, target) pairs (aligner.py over forced.py), hard
links from soft matrices (links.py), markup projected into a translation by its alignment
(projection.py), and documents aligned sentence pair by sentence pair (pair_documents.py).

Imports the engine (its sessions and tokenizers) and the rooms below it; nothing above.
"""
