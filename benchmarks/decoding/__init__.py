"""Decoding on one engine, no server: how fast, and where the time goes.

- decode: throughput of this engine (batched, one at a time, int8) beside PyTorch eager;
- step_profile: a bundle's wall time split into encoder calls, decoder-step calls and the rest,
  then ONNX Runtime's profile of the decoder step, node by node;
- stopping: the stopping rules and the decoding controls, timed side by side;
- controls: each decoding control's cost under the device search beside the numpy search;
- churn_profile: a running batch under churn (sentences joining and leaving every step), timed and
  split into graph, cache upkeep and search;
- search_host: the host's microseconds per decode step, today's search beside the device search;
- instant: the model that costs nothing (a bundle whose graphs do almost no arithmetic) that
  search_host and the tests decode, so that the host's part of a step is what is timed.
"""
