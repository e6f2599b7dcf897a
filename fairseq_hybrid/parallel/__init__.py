"""Hybrid data-model parallelism for training ``hybrid_lstm``: what runs where, and when.

- ``placement``: the placement plan (devices, layers per device, chunks, head devices).
- ``worker``: one worker thread per device; tasks run there, failures surface.
- ``schedule``: the wavefront's schedule, pure: cells, clock cycles, dependencies, time
  chunks (the engine runs it; the chunk chooser and the planning models read it).
- ``pipeline``: the model-parallel part, the schedule's LSTM cells run on the layers'
  devices, forward and backward.
- ``head_shards``: the data-parallel part, the attention/combine/output/loss head split by
  sentences over every device, forward and backward of each shard on its device's worker.
- ``engine``: one training step's features and head loss over a plan.

- ``runtime``: one model's life cycle over a plan: options -> plan -> placement ->
  workers -> (auto chunks, by a chooser handed in from above) -> engine.
- ``interface``: what the engine needs of a model (a ``Protocol``); ``split``: the one
  even split of layers, time steps and sentences.

Every device kind (CPU devices, GPUs, a mix) runs this same code. It imports the model
layer (``fairseq_hybrid/model/``), never the performance model or the fairseq plugin; the
model knows only that a runtime may run its features (``model.network``).
"""
