"""The placement plan (fairseq_hybrid/parallel/placement.py): parsing devices, layout,
chunk counts and sentence shards, and one-line refusals of bad plans."""

import pytest
import torch

from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.parallel.placement import (
    AUTO, PlacementOptions, build_plan, chunks_to_choose, parse_chunks, parse_devices, plan_for,
    shard_bounds,
)
from fairseq_hybrid.parallel.split import even_sizes, spans
from fairseq_hybrid.plugin.placement_options import check_plan_options


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
    paper = plan_for(PlacementOptions("cpu,cpu,cpu,cpu"), 4, 4)
    assert paper.layer_device == (0, 1, 2, 3)  # encoder and decoder layer i on device i
    assert paper.chunks == 1  # automatic: 1 until the engine has chosen
    assert chunks_to_choose(PlacementOptions("cpu,cpu,cpu,cpu"), paper)
    one = plan_for(PlacementOptions("cpu"), 2, 2)
    assert one.chunks == 1 and not chunks_to_choose(PlacementOptions("cpu"), one)
    assert not chunks_to_choose(PlacementOptions("cpu,cpu", chunks=3), paper)
    assert build_plan("cpu,cpu", "1,3", 2, 4, 4).layer_device == (0, 1, 1, 1)


def test_the_master_head_goes_with_the_top_layers_except_with_input_feeding():
    plan = build_plan("cpu,cpu,cpu", None, 4, 4, 4)
    assert plan.head_device == 2 and plan.head_master == plan.devices[2]
    rows = plan.table().splitlines()[2:]
    assert rows[0].endswith("embeddings, bridges, head replica") and rows[1].endswith("head replica")
    assert rows[2].endswith("master head")
    feeding = build_plan("cpu,cpu,cpu", None, 4, 4, 4, head_with_top_layers=False)
    assert feeding.head_device == 0
    assert feeding.table().splitlines()[2].endswith("embeddings, bridges, master head")
    unsplit = build_plan("cpu,cpu", None, 1, 2, 2, split_head=False)
    assert unsplit.table().splitlines()[3].endswith("head (all sentences)")
    assert unsplit.table().splitlines()[2].endswith("embeddings, bridges")


@pytest.mark.parametrize("devices,balance,chunks,message", [
    ("cpu,cpu,cpu", None, 2, "lists 3 devices for 2 encoder / 2 decoder layers"),
    ("cpu,cpu", "2,1", 2, "--hybrid-balance '2,1' is not allowed"),
    ("cpu,cpu", "2,0", 2, "--hybrid-balance '2,0' is not allowed"),
    ("cpu,cpu", "a,b", 2, "--hybrid-balance 'a,b' is not a comma-separated list"),
    # was "give 1 integers": the balance is right, the devices are missing
    (None, "1,1", 1, r"--hybrid-balance '1,1' gives layer counts for 2 device\(s\), but --hybrid-devices "
                     r"is not given \(one device: cpu\): give one count per device of --hybrid-devices "
                     r"\(e.g. --hybrid-devices cpu,cpu\), or leave --hybrid-balance out"),
    ("cpu,cpu", "2", 1, r"--hybrid-balance '2' gives layer counts for 1 device\(s\), but --hybrid-devices "
                        "'cpu,cpu' has 2"),
    ("cpu", None, -1, "--pipeline-chunks -1 is not allowed"),
])
def test_bad_plans_are_rejected(devices, balance, chunks, message):
    with pytest.raises(HybridConfigError, match=message):
        build_plan(devices, balance, chunks, 2, 2)


def test_pipeline_chunks_parse_once_into_an_integer_or_auto():
    assert parse_chunks(None) == parse_chunks(0) == parse_chunks("auto") == parse_chunks(" AUTO ") == AUTO
    assert parse_chunks(4) == parse_chunks("4") == 4
    for bad in (-1, "four", 1.5, True):
        with pytest.raises(HybridConfigError, match="--pipeline-chunks .* is not allowed"):
            parse_chunks(bad)


def test_the_even_split_is_contiguous_and_near_equal():
    assert even_sizes(7, 3) == [3, 2, 2] and even_sizes(2, 4) == [1, 1, 0, 0]
    assert spans([3, 2, 0, 2]) == [(0, 3), (3, 5), (5, 5), (5, 7)]


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
        build_plan("cuda:0,cuda:0", None, 1, 2, 2)
    plan = build_plan("cuda:0,cuda:0", None, 4, 2, 2, allow_repeated=True)
    assert plan.devices == (torch.device("cuda", 0), torch.device("cuda", 0))
    assert plan.layer_device == (0, 1) and plan.chunks == 4


def test_shards_cover_every_sentence_once():
    assert shard_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
