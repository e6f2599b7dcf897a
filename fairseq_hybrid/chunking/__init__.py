"""``--pipeline-chunks auto``: the chunk chooser that runs inside fairseq-train, before the
first update (the runtime calls ``auto_chunks.choose_for_batch``, wired in by ``plugin/``).

- ``cell_timing``: time every (layer, chunk) cell through the pipeline's own code.
- ``chunk_choice``: fit each cell's per-chunk overhead and per-step cost, predict every
  candidate K, take the fastest (pure functions).
- ``wavefront``: the simulator of the schedule the code issues (a barrier per clock cycle
  on CPU devices, dataflow on GPUs), from each cell's seconds and the link between devices.
- ``auto_chunks``: measure, fit and choose on the real model's devices and first batch.

It reads the schedule from ``parallel.schedule``; the planning models
(``fairseq_hybrid/planning/``) build on the simulator, never the other way round.
"""
