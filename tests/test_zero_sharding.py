"""fairseq's ``--zero-sharding os`` on torch's ZeroRedundancyOptimizer
(``fairseq_hybrid/plugin/sharded_optimizer.py``): 2 gloo processes that each keep part of
the optimizer state make the updates of 2 processes that keep all of it, resumed from a
sharded checkpoint too, for hybrid_lstm (``torch_adam``) and fairseq's own lstm (fairseq's
Python Adam)."""
import logging
import re

import pytest
import torch
from fairseq.optim.adam import Adam as FairseqPythonAdam

from cli import model_args, run_ranks, train_args, train_losses
from fairseq_hybrid.plugin.sharded_optimizer import shard_with_torch
from fairseq_hybrid.plugin.zero_redundancy import FairseqZeroRedundancyOptimizer

# float32 on the CPU: each process runs the same per-tensor Adam arithmetic on its share as
# the unsharded run does on every tensor, and the broadcast copies the values; measured
# difference 0.0, allowed the float32 rounding of a few updates
RTOL, ATOL = 1e-6, 1e-7
SHARE = re.compile(r"process 0 of 2 keeps the optimizer state of (\d+) of (\d+) parameter "
                   r"tensors \(([\d,]+) of ([\d,]+) elements\)")

HYBRID = [*model_args(32, 2, "--dropout", "0"), "--hybrid-devices", "cpu"]
LSTM = ["--arch", "lstm", "--cpu", "--criterion", "label_smoothed_cross_entropy",
        *[arg for name in ("encoder-embed-dim", "encoder-hidden-size", "decoder-embed-dim",
                           "decoder-hidden-size", "decoder-out-embed-dim") for arg in (f"--{name}", "16")]]


def ranks_args(data, model, save_dir, updates, optimizer, *extra):
    """fairseq-train's arguments (``cli.train_args``) with ``optimizer``; ``model`` last, so
    fairseq's lstm gets its own criterion."""
    args = train_args(data / "bin", [], "--label-smoothing", "0.1", "--clip-norm", "1.0",
                      "--max-update", str(updates), "--no-epoch-checkpoints", "--disable-validation",
                      "--log-format", "json", "--log-interval", "1", "--seed", "5",
                      "--required-batch-size-multiple", "1", *model, *extra, save_dir=save_dir)
    args[args.index("--optimizer") + 1] = optimizer
    return args


def state(path):
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer, resume", [(HYBRID, "torch_adam", True), (LSTM, "adam", False)],
                         ids=["hybrid_lstm", "lstm"])
def test_a_sharded_optimizer_state_makes_the_unsharded_updates(sample_data, tmp_path, model, optimizer, resume):
    def run(save_dir, updates, *extra):
        return run_ranks("fairseq-train", ranks_args(sample_data, model, save_dir, updates, optimizer, *extra),
                         world_size=2, cwd=sample_data)

    whole = run(tmp_path / "whole", 4)
    if resume:  # 2 updates, saved by process 0 from every process's share, then resumed
        run(tmp_path / "sharded", 2, "--zero-sharding", "os")
    sharded = run(tmp_path / "sharded", 4, "--zero-sharding", "os")
    log = sharded[0].stdout + sharded[0].stderr
    share = SHARE.search(log)
    assert share, log[-3000:]
    tensors, all_tensors, elements, all_elements = (int(g.replace(",", "")) for g in share.groups())
    assert 0 < tensors < all_tensors and 0 < elements < all_elements
    if resume:
        assert "Loaded checkpoint" in log and sorted(train_losses(log)) == [3, 4]
    reference = state(tmp_path / "whole" / "checkpoint_last.pt")
    result = state(tmp_path / "sharded" / "checkpoint_last.pt")
    assert train_losses(whole[0].stdout + whole[0].stderr)[4] == train_losses(log)[4]
    for name, value in reference["model"].items():
        torch.testing.assert_close(result["model"][name], value, rtol=RTOL, atol=ATOL)
    # the checkpoint holds every process's share, in the ordinary optimizer format
    whole_state, sharded_state = reference["last_optimizer_state"], result["last_optimizer_state"]
    assert sorted(sharded_state["state"]) == sorted(whole_state["state"]) == list(range(all_tensors))
    for index, moments in whole_state["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sharded_state["state"][index][key], moments[key], rtol=RTOL, atol=ATOL)


def test_one_process_keeps_the_whole_state_and_the_wrapper_answers_what_fairseqs_trainer_asks(caplog):
    class FairseqLike:  # what shard_ is handed: a FairseqOptimizer's two attributes
        def __init__(self, wrapped):
            self.optimizer, self.optimizer_config = wrapped, {"lr": 0.1}

    params = [torch.nn.Parameter(torch.ones(3))]
    plain = FairseqLike(torch.optim.AdamW(params, lr=0.1))
    before = plain.optimizer
    # the module's own logger, handed caplog's handler directly: an earlier test in this
    # process (fairseq's CLI mains configure logging) may have stopped it propagating
    module_logger = logging.getLogger("fairseq_hybrid.plugin.sharded_optimizer")
    module_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger=module_logger.name):
            shard_with_torch(plain, None)  # torch.distributed is not initialised in this process
    finally:
        module_logger.removeHandler(caplog.handler)
    assert plain.optimizer is before
    assert "one data-parallel process, nothing to share" in caplog.text

    import torch.distributed as dist

    from cli import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        weights = [torch.nn.Parameter(torch.ones(4, 2)), torch.nn.Parameter(torch.zeros(3))]
        sharded = FairseqZeroRedundancyOptimizer(weights, optimizer_class=FairseqPythonAdam, lr=0.1)
        assert sharded.supports_memory_efficient_fp16 is True  # fairseq's Adam's flag, forwarded
        assert sharded.supports_flat_params is True
        assert sharded.disable_mem_eff_fp16_loading_hack is True
        with pytest.raises(AttributeError, match="no attribute 'supports_step_with_scale'"):
            sharded.supports_step_with_scale  # noqa: B018 - fairseq's Adam has no such flag
        assert sharded.held_share() == ("process 0 of 1 keeps the optimizer state of 2 of 2 "
                                        "parameter tensors (11 of 11 elements)")
        for weight in weights:
            weight.grad = torch.full_like(weight, 0.5)
        sharded.step()
        sharded.consolidate_state_dict()
        saved = sharded.state_dict()
        assert sorted(saved["state"]) == [0, 1] and saved["state"][0]["exp_avg"].shape == (4, 2)
        assert sorted(sharded.broadcast_global_state_dict(saved)["state"]) == [0, 1]
    finally:
        dist.destroy_process_group()
