"""The peer toolkits run for real, and what the importers are tested against (not importers).

Runners that train and decode with OpenNMT-py, Joey NMT (toolkits.py) and Marian (marian_toolkit.py,
marian_guided.py) through their own command lines; a tiny Hugging Face MarianMTModel made here
(hf_fixture.py); marian-decoder's beam search over a bundle's graphs as a reference
(marian_search.py). The tests, the benchmarks and docs/import.md use them to make real checkpoints
and the toolkits' own translations; export/importers/ never imports them.
"""
