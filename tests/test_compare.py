"""planning/compare.py: every way to train on N devices (hybrid, DDP, DDP with a sharded
optimizer, hybrid groups inside DDP), each checked against its definition recomputed here
from the simulator's own parts, and the pick among them."""
import math

import pytest

from fairseq_hybrid.planning import compare as compare_module
from fairseq_hybrid.planning.analytic import stage_times_from_profile
from fairseq_hybrid.planning.compare import (
    SAME_BATCH, allreduce_seconds, compare_profile, ddp_sharded_step, ddp_step, fastest, group_splits,
)
from fairseq_hybrid.planning.profiles import PROFILES
from fairseq_hybrid.planning.step_time import predict_step
from fairseq_hybrid.chunking.wavefront import Link
from fairseq_hybrid.planning.sizes import BatchSize, ModelSize

PROFILE = PROFILES["h100-sxm"]
MODEL, BATCH = ModelSize(4, 64, 64, 1000), BatchSize(64, 12, 12)


def test_group_splits_are_every_factorisation_with_a_layer_per_stage():
    assert group_splits(8, 4) == [(2, 4), (4, 2)]
    assert group_splits(4, 4) == [(2, 2)]
    assert group_splits(6, 4) == [(2, 3), (3, 2)]
    assert group_splits(2, 4) == [] and group_splits(7, 4) == []
    assert group_splits(8, 2) == [(2, 4)]  # 4 stages would need 4 layers


def test_the_sharded_optimizer_steps_a_share_and_gathers_the_rest():
    stage = stage_times_from_profile(MODEL, BATCH, PROFILE, [1], [1])
    link = Link(1e9, 1e-5)
    params = stage.param_bytes_master + sum(stage.param_bytes_layer)
    plain, sharded = ddp_step(stage, 4, link), ddp_sharded_step(stage, 4, link)
    gather = 3 / 4 * params / 1e9 + 3 * 1e-5
    assert sharded["gather"] == pytest.approx(gather)
    assert sharded["total"] == pytest.approx(plain["total"] - 3 / 4 * stage.rest + gather)
    assert ddp_sharded_step(stage, 1, link)["total"] == pytest.approx(ddp_step(stage, 1, link)["total"])


def test_a_group_is_a_hybrid_at_its_share_of_the_batch_plus_an_all_reduce_after_backward():
    link = Link(25e9, 15e-6)
    rows = compare_profile(PROFILE, MODEL, BATCH, [4], [1, 2, 4], link)
    (group,) = [p for p in rows["groups"] if p.devices == 4]
    assert (group.stages, group.replicas) == (2, 2)
    share = BatchSize(math.ceil(BATCH.sentences / 2), BATCH.source_len, BATCH.target_len)
    stage = stage_times_from_profile(MODEL, share, PROFILE, [1, 2, 4], [1, 2])
    steps = {k: predict_step(stage, 2, k, "dataflow", link)["total"] for k in (1, 2, 4)}
    ring = allreduce_seconds(stage.param_bytes_master + sum(stage.param_bytes_layer), 2, link)
    assert group.chunks == min(steps, key=steps.get)
    assert group.step_s == pytest.approx(min(steps.values()) + ring)
    assert group.exposed_allreduce_s == pytest.approx(ring)
    base = predict_step(stage_times_from_profile(MODEL, BATCH, PROFILE, [1], [1]), 1, 1, "dataflow", link)
    assert group.speedup == pytest.approx(base["total"] / group.step_s)


def test_the_pick_is_the_fastest_scheme_that_runs_at_the_users_batch(monkeypatch):
    rows = compare_profile(PROFILE, ModelSize(4, 1000, 1000, 32000), BatchSize(250, 32, 32),
                           [2, 4, 8], [1, 2, 4, 8])
    def pick(runnable):  # the first in SAME_BATCH's order within 2% of the fastest
        best = max(runnable.values())
        return next(name for name in SAME_BATCH if runnable.get(name, 0) * 1.02 >= best)

    for n in (2, 4, 8):
        monkeypatch.setattr(compare_module, "SHARDED_OPTIMIZER", None)
        runnable = {name: p.speedup for name in SAME_BATCH if name != "ddp_sharded"
                    for p in rows[name] if p.devices == n}
        assert fastest(rows, n) == pick(runnable)
        assert "hybrid" in runnable or n > 4  # 8 devices: no hybrid over 4 layers
        monkeypatch.setattr(compare_module, "SHARDED_OPTIMIZER", ("--zero-sharding", "os"))
        runnable.update({"ddp_sharded": p.speedup for p in rows["ddp_sharded"] if p.devices == n})
        assert fastest(rows, n) == pick(runnable)
        # DDP at N x the batch trains another batch: only when asked
        assert fastest(rows, n, same_batch=False) == "ddp_n_batch"
    # a near tie goes to the simpler scheme
    near = {"hybrid": [compare_module.SchemePrediction(2, 1.0, 8, 1.0, 1, stages=2)],
            "ddp_same_batch": [compare_module.SchemePrediction(2, 1.0, 8, 1.015, replicas=2)]}
    assert fastest(near, 2) == "hybrid"
    near["ddp_same_batch"] = [compare_module.SchemePrediction(2, 1.0, 8, 1.03, replicas=2)]
    assert fastest(near, 2) == "ddp_same_batch"
