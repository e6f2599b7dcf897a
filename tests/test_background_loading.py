"""plugin/background_loading.py: a process that stops reading fairseq's BufferedIterator
before its end (a training stopped by --max-update) exits cleanly with the plugin loaded,
where fairseq alone aborts in its loading thread."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, torch
    if sys.argv[1] == "plugin":
        import fairseq_hybrid  # noqa: F401 - installs the patches
    from fairseq.data import iterators

    def batches():  # each batch built by torch in C++, as a collater does
        rows = [torch.randn(300) for _ in range(200)]
        while True:
            padded = torch.nn.utils.rnn.pad_sequence(rows)
            yield padded @ padded.t()

    class Source:
        def __len__(self):
            return 10 ** 6
        def __iter__(self):
            return batches()

    loader = iterators.BufferedIterator(10 ** 6, Source())
    for _ in range(3):
        next(loader)
    print("stopped early", flush=True)
""")


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_stopping_early_exits_cleanly_with_the_plugin():
    for _ in range(3):
        done = run("plugin")
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == "stopped early\n" and "terminate called" not in done.stderr


@pytest.mark.slow
def test_fairseq_alone_aborts_there():
    """The control: the same script without the plugin dies in fairseq's thread (so the test
    above can fail)."""
    aborted = [run("fairseq") for _ in range(3)]
    assert any(p.returncode != 0 and "terminate called" in p.stderr for p in aborted), \
        [(p.returncode, p.stderr[-300:]) for p in aborted]
