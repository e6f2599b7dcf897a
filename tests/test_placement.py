"""The placement plan (fairseq_hybrid/parallel/placement.py): parsing devices, layout,
chunk counts and sentence shards, and one-line refusals of bad plans."""

import pytest
import torch

from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.parallel.placement import (
    build_plan, check_plan_options, parse_devices, shard_bounds,
)


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


def test_shards_cover_every_sentence_once():
    assert shard_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
