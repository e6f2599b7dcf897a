"""tests/forkserver.py: a command the fork server starts behaves as the same command in a
fresh interpreter (exit status, both output streams, where logging goes), and is a process
of its own."""
import re
import signal
import subprocess

import pytest

import forkserver
from cli import BIN, USER_DIR, model_args, plain_tool_env, train_args

NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")


def lines(output: bytes):
    """Output lines with every number masked (times, speeds, memory), and without the
    tensorboardX hint fairseq logs while it is imported (the server imported it: the one
    line a fork does not print)."""
    return [NUMBER.sub("#", line) for line in output.decode().splitlines() if "tensorboardX" not in line]


@pytest.fixture(scope="module")
def server():
    started = forkserver.ForkServer(plain_tool_env())
    yield started
    started.stop()


def commands(data, tmp_path):
    """Three commands, each as a function of the run's name (fresh or forked): refused
    while parsing, failing while loading, and a short training with its log."""
    return {
        "refused": lambda which: ["fairseq-train", str(data), "--user-dir", USER_DIR, *model_args(8, 1),
                                  "--max-tokens", "-5"],
        "generate-fails": lambda which: ["fairseq-generate", str(data), "--user-dir", USER_DIR,
                                         "--path", str(tmp_path / "none.pt")],
        "trains": lambda which: ["fairseq-train", *train_args(data, model_args(8, 1), "--max-epoch", "1",
                                                              save_dir=tmp_path / which)],
    }


@pytest.mark.parametrize("name, code", [("refused", 1), ("generate-fails", 1), ("trains", 0)])
def test_a_forked_command_exits_and_prints_as_a_fresh_one(server, small_sample_data, tmp_path, name, code):
    command = commands(small_sample_data / "bin", tmp_path)[name]
    results = {}
    for which in ("fresh", "forked"):
        tool, *args = command(which)
        argv = [str(BIN / tool), *args]
        if which == "fresh":
            results[which] = subprocess.run(argv, cwd=tmp_path, capture_output=True, env=server.env, timeout=300)
        else:
            assert server.serves(argv, plain_tool_env())
            results[which] = server.run(argv, tmp_path, None, timeout=300, env=plain_tool_env())
    fresh, forked = results["fresh"], results["forked"]
    assert fresh.returncode == forked.returncode == code
    assert fresh.stdout.strip() or fresh.stderr.strip()  # there is something to compare
    unnamed = re.compile(r"\b(fresh|forked)\b")  # the save directories' names
    assert [unnamed.sub("", x) for x in lines(fresh.stdout)] == [unnamed.sub("", x) for x in lines(forked.stdout)]
    assert lines(fresh.stderr) == lines(forked.stderr)


def test_a_forked_command_is_a_process_of_its_own(server, small_sample_data, tmp_path):
    """Its own pid, which a signal reaches (the status says so, as subprocess reports it),
    a timeout that kills it, and only commands the server can run faithfully."""
    endless = [str(BIN / "fairseq-train"), *train_args(small_sample_data / "bin", model_args(8, 1),
                                                       "--max-epoch", "100000", save_dir=tmp_path / "a")]
    started = server.start(endless, tmp_path, None)
    assert started.pid > 0
    started.kill()
    assert started.wait(timeout=120).returncode == -signal.SIGKILL
    endless[endless.index(str(tmp_path / "a"))] = str(tmp_path / "b")
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(endless, tmp_path, None, timeout=0.5)
    # another environment, or a script of another interpreter, runs as a fresh process
    assert not server.serves(endless, dict(plain_tool_env(), LC_ALL="C"))
    (tmp_path / "tool").write_text("#!/bin/sh\necho hi\n")
    assert not server.serves([str(tmp_path / "tool")], plain_tool_env())
