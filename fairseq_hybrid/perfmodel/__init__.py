"""A performance model of the hybrid training step: measure one device, simulate N.

- ``sizes``: model and batch shapes, the device link, presets.
- ``measure``: one device's stage times, through the pipeline's own cell code.
- ``stage_times``: what the measurement yields and the simulator reads.
- ``simulate``: the clock-cycle schedule the code issues, simulated for N devices and K
  chunks (barrier per cycle on CPU devices, dataflow on GPUs); step and speedup predictions.
- GPUs without one: ``profiles`` (rates, the LSTM's curves from ``lstm_published``, the
  host's time per task), ``analytic`` (stage times from FLOPs and bytes), ``host_bound``
  (the one Python process's pace), ``compare`` (against DDP), ``planned`` (steps not built).

The wavefront's cells, cycles and dependencies come from ``parallel.schedule``, the same
rule the pipeline runs. ``benchmarks/pipeline_model.py`` validates the model
against real training steps and reports it.
"""
from .measure import device_clock, measure_concurrency, measure_model_stage_times
from .simulate import SCHEDULES, predict_speedups, predict_step, simulate_pipeline
from .sizes import PRESETS, BatchSize, Link, ModelSize, Preset, layer_map
from .stage_times import CellTimes, StageTimes

__all__ = [
    "PRESETS", "SCHEDULES", "BatchSize", "CellTimes", "Link", "ModelSize", "Preset",
    "StageTimes", "device_clock", "layer_map", "measure_concurrency",
    "measure_model_stage_times", "predict_speedups", "predict_step", "simulate_pipeline",
]
