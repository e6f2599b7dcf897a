"""The placement plan (fairseq_hybrid/parallel/placement.py) from typed values: layout,
head devices, chunk counts, sentence shards, and a caller's mistakes refused without any
command-line wording (the options are parsed and checked in plugin/placement_options.py:
tests/test_placement_options.py)."""
import re
from pathlib import Path

import pytest
import torch

from fairseq_hybrid.parallel.placement import (
    AUTO, build_plan, default_device, devices_of, plan_for, resolved_chunks, shard_bounds,
)
from fairseq_hybrid.plugin.placement_options import PlacementOptions

CPU = torch.device("cpu")
PARALLEL = Path(__file__).resolve().parents[1] / "fairseq_hybrid" / "parallel"


def test_even_contiguous_layout_and_paper_layout():
    plan = build_plan((CPU,) * 3, None, 4, 4, 4)
    assert plan.layer_device == (0, 0, 1, 2) and plan.chunks == 4
    paper = plan_for(PlacementOptions((CPU,) * 4), 4, 4, chunks=8)
    assert paper.layer_device == (0, 1, 2, 3)  # encoder and decoder layer i on device i
    assert build_plan((CPU,) * 2, (1, 3), 2, 4, 4).layer_device == (0, 1, 1, 1)


def test_no_devices_means_this_processs_device():
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else CPU
    assert default_device() == expected and devices_of(None) == (expected,)
    assert build_plan(None, None, 1, 2, 2).devices == (expected,)


def test_auto_is_one_chunk_on_one_device_and_the_choosers_on_several():
    assert resolved_chunks(PlacementOptions((CPU,), chunks=AUTO)) == 1
    assert resolved_chunks(PlacementOptions(None, chunks=AUTO)) == 1  # the default device
    assert resolved_chunks(PlacementOptions((CPU,) * 4, chunks=AUTO)) is None
    assert resolved_chunks(PlacementOptions((CPU,) * 2, chunks=3)) == 3
    assert repr(AUTO) == "AUTO" and AUTO.value == "auto"


def test_the_master_head_goes_with_the_top_layers_except_with_input_feeding():
    plan = build_plan((CPU,) * 3, None, 4, 4, 4)
    assert plan.head_device == 2 and plan.head_master == plan.devices[2]
    rows = plan.table().splitlines()[2:]
    assert rows[0].endswith("embeddings, bridges, head replica") and rows[1].endswith("head replica")
    assert rows[2].endswith("master head")
    feeding = build_plan((CPU,) * 3, None, 4, 4, 4, head_with_top_layers=False)
    assert feeding.head_device == 0
    assert feeding.table().splitlines()[2].endswith("embeddings, bridges, master head")
    unsplit = build_plan((CPU,) * 2, None, 1, 2, 2, split_head=False)
    assert unsplit.table().splitlines()[3].endswith("head (all sentences)")
    assert unsplit.table().splitlines()[2].endswith("embeddings, bridges")


@pytest.mark.parametrize("devices,balance,chunks,layers,error,message", [
    ((CPU,) * 3, None, 2, 2, ValueError, r"3 device\(s\) with layers per device \[1, 1, 0\] for 2 layers"),
    ((CPU,) * 2, (2, 1), 2, 2, ValueError, "every device needs a layer and every layer a device"),
    ((CPU,) * 2, (2, 0), 2, 2, ValueError, "every device needs a layer"),
    ((CPU,) * 2, (2,), 2, 2, ValueError, "every device needs a layer"),
    ((CPU,), None, 0, 2, ValueError, "an integer chunk count >= 1, not 0"),
    ((CPU,), None, AUTO, 2, ValueError, "an integer chunk count >= 1, not AUTO"),
    (("cpu", "cpu"), None, 1, 2, TypeError, "devices must be torch.device values"),
])
def test_a_callers_mistakes_are_refused(devices, balance, chunks, layers, error, message):
    """Not user input (the gate refuses that with its one line): a plan of typed values
    that cannot be placed."""
    with pytest.raises(error, match=message):
        build_plan(devices, balance, chunks, layers, layers)


def test_parallel_names_no_command_line_option():
    """The plan takes typed values: no flag, no option attribute, no user-facing wording."""
    pattern = re.compile(r"--hybrid|--pipeline|pipeline_chunks|hybrid_devices|hybrid_balance|HybridConfigError")
    found = [f"{path.name}:{number}" for path in sorted(PARALLEL.glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_shards_cover_every_sentence_once():
    assert shard_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
