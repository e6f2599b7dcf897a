"""Predicting, comparing and advising: the performance model of a whole training step,
used by the advisor (``tools/advise.py``) and the benchmarks, never by fairseq-train.

- ``sizes``: model and batch shapes, the benchmark presets.
- ``measure``: one device's stage times, through the pipeline's own cell code.
- ``stage_times``: what the measurement yields and the step model reads.
- ``step_time``: one step's seconds by part on N devices and K chunks (the pipeline from
  ``chunking.wavefront``), and speedups.
- GPUs without one: ``profiles`` (rates, the LSTM's curves from ``lstm_published``, the
  host's time per task), ``rates`` (a profile measured on this machine), ``analytic``
  (stage times from FLOPs and bytes), ``traffic`` (bytes per route), ``host_bound`` (the
  one Python process's pace), ``compare`` (against DDP), ``planned`` (steps not built).
- ``recommend``: the advisor's recommendations from measured stage times.

``benchmarks/pipeline_model.py`` validates the model against real training steps and
reports it.
"""
from .measure import measure_concurrency, measure_model_stage_times
from .sizes import BENCHMARK_PRESETS, BatchSize, ModelSize, Preset, layer_map
from .stage_times import HostTimes, StageTimes
from .step_time import predict_speedups, predict_step

__all__ = [
    "BENCHMARK_PRESETS", "BatchSize", "HostTimes", "ModelSize", "Preset", "StageTimes", "layer_map",
    "measure_concurrency", "measure_model_stage_times", "predict_speedups", "predict_step",
]
