"""Test-wide setup: the test helpers (cli.py, helpers.py) and the repository root are importable;
fixtures shared by several test modules."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# OpenMP threads that wait for work sleep instead of spinning. torch's intra-op pool (libgomp)
# spins by default; on a busy 2-core machine (CI, or other work beside the tests) two spinning
# threads per process made a 2-thread fairseq-train 3x slower in wall time and CPU (measured:
# 12 updates of the scaling test's lstm 40 s / 26 CPU-s spinning, 14 s / 9 CPU-s passive); on
# an idle machine it changes nothing measurable. Read when libgomp loads: before torch below;
# every process the tests start inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def full_precision_reference(monkeypatch):
    """fairseq's log_softmax always computes in float32; keep float64 float64 so float64
    comparisons against fairseq's criterion are exact to 1e-10, not float32 rounding."""
    from fairseq import utils

    def log_softmax(x, dim, onnx_trace=False):
        return F.log_softmax(x if x.dtype == torch.float64 else x.float(), dim=dim)

    monkeypatch.setattr(utils, "log_softmax", log_softmax)


# the modules whose tests take longest (seconds, one core, 2026-12-05), started first
LONGEST_FIRST = {"test_gpu_check.py": 60, "test_benchmarks.py": 50, "test_wmt_recipe.py": 48,
                 "test_resume_epochs.py": 35, "test_resume.py": 26}


def pytest_collection_modifyitems(config, items):
    """The end-to-end tests (marked slow, seconds to a minute each) first, the modules
    with the longest of them before the rest: ``make test`` hands tests to its workers in
    this order, and a long test started last would leave the other worker idle at the end."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 -LONGEST_FIRST.get(item.path.name, 0)))


def shared_sample(tmp_path_factory, worker_id: str, name: str, train: int, valid: int, test: int):
    """A binarized subset of the bundled corpus (``cli.prepared_sample``) made once per run
    and shared by every pytest-xdist worker (``cli.made_once``)."""
    from cli import made_once, prepared_sample

    return made_once(tmp_path_factory, worker_id, name,
                     lambda folder: prepared_sample(folder, train=train, valid=valid, test=test))


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory, worker_id):
    """The bundled corpus's first 400/20/20 train/valid/test pairs, binarized once per
    run (raw/ and bin/) and shared by the end-to-end tests that only read it — by every
    pytest-xdist worker too (the first one prepares it under a lock): each
    fairseq-preprocess run is a process start of several seconds. Tests write their
    checkpoints under their own tmp_path, never here."""
    return shared_sample(tmp_path_factory, worker_id, "sample", train=400, valid=20, test=20)


@pytest.fixture(scope="session")
def small_sample_data(tmp_path_factory, worker_id):
    """The bundled corpus's first 40/10/6 train/valid/test pairs, binarized once per run
    (raw/ and bin/) like ``sample_data`` and shared by the xdist workers the same way: one
    batch an epoch at --max-tokens 1000, and a dictionary other than sample_data's. Tests
    only read it."""
    return shared_sample(tmp_path_factory, worker_id, "small_sample", train=40, valid=10, test=6)
