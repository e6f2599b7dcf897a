"""plugin/world_size.py: fairseq's start of several processes on one machine, for every model."""
from types import SimpleNamespace

import pytest
import torch
from fairseq.distributed import utils as distributed_utils

import fairseq_hybrid  # noqa: F401  (installs the patches)
from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.plugin.world_size import check_world_size



def test_torchrun_starts_cpu_processes_where_fairseq_divides_by_the_gpu_count(monkeypatch):
    """fairseq's torchrun reading picks ``rank % torch.cuda.device_count()`` (a
    ZeroDivisionError without GPUs); the plugin's CPU processes get device 0, the rest as
    fairseq sets it."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "3", "RANK": "2"}.items():
        monkeypatch.setenv(key, value)
    cfg = SimpleNamespace(distributed_init_method=None, tpu=False, pipeline_model_parallel=False,
                          distributed_world_size=3, distributed_rank=0, device_id=5,
                          distributed_no_spawn=False)
    distributed_utils.infer_init_method(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank,
            cfg.device_id, cfg.distributed_no_spawn) == ("env://", 3, 2, 0, True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # GPUs: fairseq's own rule
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    cfg.distributed_init_method, cfg.device_id = None, 5
    distributed_utils.infer_init_method(cfg)
    assert cfg.device_id == 0 and cfg.distributed_rank == 2  # 2 % 2


def test_more_processes_than_gpus_is_one_line_naming_what_to_do():
    check_world_size(2, 2)
    with pytest.raises(HybridConfigError, match=r"--distributed-world-size 3 is not allowed here: .* it has 2; use "
                                                r"--distributed-world-size 2 or less, or start each of the 3"):
        check_world_size(3, 2)
