"""Placement plan, pipeline schedule and device workers: units."""
import threading

import pytest
import torch

from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.parallel.pipeline import DECODER, ENCODER, chunk_bounds, clock_cycles
from fairseq_hybrid.parallel.placement import (
    build_plan, check_plan_options, parse_devices, shard_bounds,
)
from fairseq_hybrid.parallel.worker import DeviceWorkers, WorkerError


def test_devices_parse_every_spelling():
    assert parse_devices("cpu,cpu,cpu") == [torch.device("cpu")] * 3
    assert parse_devices(" cpu , CPU") == [torch.device("cpu")] * 2
    assert parse_devices(None) == [torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")]


@pytest.mark.parametrize("spec,message", [
    ("cuda:9", "cuda:9 is not available"),
    ("9", "cuda:9 is not available"),
    ("gpu0", "unknown device 'gpu0'"),
    ("", "has an empty entry"),
    ("cpu,", "has an empty entry"),
])
def test_bad_devices_name_the_value(spec, message):
    with pytest.raises(HybridConfigError, match=message) as error:
        parse_devices(spec)
    assert "\n" not in str(error.value)


def test_even_contiguous_layout_and_paper_layout():
    plan = build_plan("cpu,cpu,cpu", None, 4, 4, 4)
    assert plan.layer_device == (0, 0, 1, 2)
    paper = build_plan("cpu,cpu,cpu,cpu", None, None, 4, 4)
    assert paper.layer_device == (0, 1, 2, 3)  # encoder and decoder layer i on device i
    assert paper.chunks == 8  # automatic: 2 per device
    assert build_plan("cpu", None, None, 2, 2).chunks == 1
    assert build_plan("cpu,cpu", "1,3", 2, 4, 4).layer_device == (0, 1, 1, 1)
    assert "master head" in plan.table()


@pytest.mark.parametrize("devices,balance,chunks,message", [
    ("cpu,cpu,cpu", None, 2, "lists 3 devices for 2 encoder / 2 decoder layers"),
    ("cpu,cpu", "2,1", 2, "--hybrid-balance '2,1' is not allowed"),
    ("cpu,cpu", "2,0", 2, "--hybrid-balance '2,0' is not allowed"),
    ("cpu,cpu", "a,b", 2, "--hybrid-balance 'a,b' is not a comma-separated list"),
    ("cpu", None, -1, "--pipeline-chunks -1 is not allowed"),
])
def test_bad_plans_are_rejected(devices, balance, chunks, message):
    with pytest.raises(HybridConfigError, match=message):
        build_plan(devices, balance, chunks, 2, 2)


def test_explicit_zero_chunks_is_rejected_but_fairseqs_default_is_not():
    from types import SimpleNamespace

    args = SimpleNamespace(hybrid_devices="cpu", pipeline_chunks=0, encoder_layers=2, decoder_layers=2)
    check_plan_options(args, argv=["data"])  # fairseq's default 0: automatic
    with pytest.raises(HybridConfigError, match="--pipeline-chunks 0 is not allowed"):
        check_plan_options(args, argv=["data", "--pipeline-chunks", "0"])
    with pytest.raises(HybridConfigError, match="--pipeline-chunks 0 is not allowed"):
        check_plan_options(args, argv=["data", "--pipeline-chunks=0"])


def test_shards_and_chunks_cover_everything_once():
    assert shard_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(2, 5) == [(0, 1), (1, 2)]
    assert chunk_bounds(0, 3) == []


def test_clock_cycles_form_a_wavefront():
    cycles = clock_cycles(source_chunks=3, target_chunks=2, layers=2)
    when = {(c.side, c.layer, c.chunk): i for i, cycle in enumerate(cycles) for c in cycle}
    assert len(when) == 2 * 3 + 2 * 2
    for (side, layer, chunk), cycle in when.items():
        if chunk > 0:
            assert when[(side, layer, chunk - 1)] < cycle
        if layer > 0:
            assert when[(side, layer - 1, chunk)] < cycle
        if side == DECODER and chunk == 0:
            assert when[(ENCODER, layer, 2)] < cycle
    # layer 1 works on chunk 0 while layer 0 works on chunk 1
    assert {(c.layer, c.chunk) for c in cycles[1]} == {(0, 1), (1, 0)}


def test_worker_failure_reaches_the_caller_and_nothing_hangs():
    workers = DeviceWorkers([torch.device("cpu"), torch.device("cpu")])
    names = workers.run_all([(0, "a", lambda: threading.current_thread().name),
                             (1, "b", lambda: threading.current_thread().name)])
    assert names[0] != names[1]

    def boom():
        raise ValueError("bad shape 7")

    with pytest.raises(WorkerError, match=r"layer 3 failed on worker 1 \(cpu\): ValueError: bad shape 7") as error:
        workers.run_all([(0, "fine", lambda: 1), (1, "layer 3", boom)])
    assert isinstance(error.value.__cause__, ValueError)
    assert error.value.__cause__.__traceback__ is not None
    assert workers.run_all([(1, "after", lambda: 42)]) == [42]  # the worker still serves
    workers.close()


def test_worker_failure_inside_training_propagates():
    from fairseq_hybrid.criterion import HybridCrossEntropyCriterion
    from helpers import make_batch, make_dictionary, make_model, make_task, random_lengths

    dictionary = make_dictionary()
    model = make_model(dictionary, encoder_layers=2, decoder_layers=2)
    model.placement_options = {"hybrid_devices": "cpu,cpu", "pipeline_chunks": 2}
    batch = make_batch(dictionary, random_lengths(4, seed=2))
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.0)
    criterion(model, batch)
    layer = model.decoder.stack.layers[1]
    layer.weight_ih_l0.data = layer.weight_ih_l0.data[:, :3]  # a broken layer
    with pytest.raises(WorkerError, match="decoder layer 1 chunk 0 failed on worker 1"):
        criterion(model, batch)


def test_fairseq_defaults_are_adapted_for_one_process_many_devices():
    from types import SimpleNamespace

    from fairseq_hybrid.integration import adapt_fairseq_defaults, explicit_option

    assert explicit_option("--ddp-backend", ["x", "--ddp-backend=no_c10d"]) == "no_c10d"
    assert explicit_option("--ddp-backend", ["x"]) is None
    args = SimpleNamespace(distributed_world_size=4, ddp_backend="pytorch_ddp", bf16=False,
                           fp16=True, fp16_no_flatten_grads=False)
    adapt_fairseq_defaults(args, cuda_devices=4, argv=["data"])
    assert (args.distributed_world_size, args.ddp_backend) == (1, "legacy_ddp")
    assert args.fp16_no_flatten_grads
    args = SimpleNamespace(distributed_world_size=2, ddp_backend="legacy_ddp", bf16=False)
    adapt_fairseq_defaults(args, cuda_devices=4, argv=["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"])
    assert (args.distributed_world_size, args.ddp_backend) == (2, "legacy_ddp")
    with pytest.raises(HybridConfigError, match="--ddp-backend pytorch_ddp is not allowed"):
        adapt_fairseq_defaults(SimpleNamespace(ddp_backend="pytorch_ddp"), 1, ["--ddp-backend", "pytorch_ddp"])


def test_a_gpu_listed_twice_is_rejected(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_devices("0,cuda:1") == [torch.device("cuda", 0), torch.device("cuda", 1)]
    with pytest.raises(HybridConfigError, match=r"'0,cuda:0' lists cuda:0 more than once"):
        parse_devices("0,cuda:0")


def test_a_gpu_listed_twice_is_allowed_only_when_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(HybridConfigError, match="add --hybrid-allow-repeated-devices"):
        build_plan("cuda:0,cuda:0", None, None, 2, 2)
    plan = build_plan("cuda:0,cuda:0", None, None, 2, 2, allow_repeated=True)
    assert plan.devices == (torch.device("cuda", 0), torch.device("cuda", 0))
    assert plan.layer_device == (0, 1) and plan.chunks == 4
