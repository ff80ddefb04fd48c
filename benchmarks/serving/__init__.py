"""Serving figures: whole servers and their parts, under closed-loop load.

- served: the served rate of one server, one model, on each provider in turn;
- transformer_served: a Transformer served at 64 clients and at one, beside CTranslate2 offline on
  the same weights, texts and threads (with py-spy's split of the engine when asked);
- serving_loop: the decode loop alone (a Worker, no gRPC) under each batching policy;
- layouts: served sentences/s of whole servers laid out several ways (fronts, engines, threads);
- front_cost: one front process's CPU time per request, behind instant_engine (an engine that
  answers at once over the real channel);
- zmq_channel: the front/engine channel's encoders (msgspec, msgpack, pickle) and its ZeroMQ round
  trip;
- grpc_channels: one long-lived gRPC (HTTP/2) channel beside many, on a real server;
- pod_memory: resident memory of a server's processes, idle and after load;
- model_memory: what each embedded model's graphs hold in memory against the size of its files
  (and what its device-search variants add);
- memory_load: how long a memory file of N entries takes to load, and what it holds;
- json_mapping: what one answer costs to encode for each face: protobuf (gRPC) against JSON (HTTP);
- before_after: this checkout against an earlier one, served at 64 clients and s2s-translate, in
  interleaved rounds (a restructuring's "no slower");
- documents_served: documents (5-50 sentences, split_sentences on) beside single sentences on one
  server at 32 clients: sentences/s against the same sentences one a request, the singles' p50/p99
  beside and without them, TranslateStream's first message against the whole answer.
"""
