"""Run fairseq's command-line tools the way a user does (subprocesses of this venv)."""
from __future__ import annotations

import io
import json
import locale
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import forkserver

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "fairseq_hybrid")
SAMPLE = REPO / "data" / "ende-sample"
CONFIG_DIR = REPO / "recipes" / "config"  # the Hydra configs the recipes train with
BIN = Path(sys.executable).parent


def tool_env(**extra: str) -> Dict[str, str]:
    """The environment of the tools the tests start: warnings off, one OpenMP thread each."""
    return dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **extra)


def as_text(output: bytes) -> str:
    """Output as ``subprocess.run(text=True)`` reads it (locale encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(output), encoding=locale.getpreferredencoding(False)).read()


def plain_tool_env(**extra: str) -> Dict[str, str]:
    """The environment ``run_tool`` gives a command: ``tool_env`` (with ``extra``), no GPU visible."""
    env = tool_env(**extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_tool(tool: str, args: List[str], cwd: Path, stdin: Optional[Union[str, bytes]] = None,
             check: bool = True, timeout: int = 600,
             env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``tool`` of this venv on ``args`` (no GPU visible); ``stdin`` text, or bytes passed as
    they are; ``env``: variables added to ``tool_env``'s. Its output as text."""
    full_env = plain_tool_env(**(env or {}))
    argv = [str(BIN / tool), *args]
    data = stdin.encode() if isinstance(stdin, str) else stdin
    forks = forkserver.server(plain_tool_env())
    if forks is not None and forks.serves(argv, full_env):
        proc = forks.run(argv, cwd, data, timeout, full_env)
    else:
        proc = subprocess.run(argv, cwd=cwd, input=data, capture_output=True, env=full_env, timeout=timeout)
    decode = bytes.decode if isinstance(stdin, bytes) else as_text
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, decode(proc.stdout), decode(proc.stderr))
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{tool} exited {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\n"
            f"STDERR:\n{proc.stderr[-4000:]}"
        )
    return proc


def model_args(dim: int, layers: Optional[int] = None, *extra: str) -> List[str]:
    """``--arch hybrid_lstm`` with every embedding and hidden size ``dim``."""
    args = ["--arch", "hybrid_lstm"]
    for name in ("encoder-embed-dim", "encoder-hidden-size", "decoder-embed-dim",
                 "decoder-hidden-size", "decoder-out-embed-dim"):
        args += [f"--{name}", str(dim)]
    if layers is not None:
        args += ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    return args + list(extra)


def train_args(data: Path, model: Sequence[str], *extra: str, save_dir: Optional[Path] = None,
               lr: float = 0.003, max_tokens: int = 300) -> List[str]:
    """fairseq-train's arguments for ``hybrid_lstm`` with ``hybrid_cross_entropy`` and Adam,
    no data-loading workers; ``extra`` last (so it overrides)."""
    args = [str(data), "--user-dir", USER_DIR, *model, "--criterion", "hybrid_cross_entropy",
            "--optimizer", "adam", "--lr", str(lr), "--max-tokens", str(max_tokens),
            "--num-workers", "0"]
    if save_dir is not None:
        args += ["--save-dir", str(save_dir)]
    return args + list(extra)


def train_losses(log: str) -> Dict[int, float]:
    """update -> training loss, from fairseq's ``--log-format json`` train_inner records."""
    losses = {}
    for line in log.splitlines():
        if "train_inner" in line and "{" in line:
            record = json.loads(line[line.index("{"):])
            losses[int(record["num_updates"])] = float(record["loss"])
    return losses


def hypotheses(stdout: str, prefixes: Sequence[str] = ("H-",)) -> List[str]:
    """fairseq-generate/-interactive output lines with one of ``prefixes``, in order."""
    return [line for line in stdout.splitlines() if line.startswith(tuple(prefixes))]


def write_sample_subset(dest: Path, train: int, valid: int, test: int) -> None:
    """The first lines of the bundled corpus, whitespace-tokenised (no sentencepiece)."""
    dest.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("valid", valid), ("test", test)):
        for lang in ("en", "de"):
            lines = (SAMPLE / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (dest / f"{split}.{lang}").write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")


def preprocess(raw: Path, dest: Path) -> None:
    run_tool("fairseq-preprocess", [
        "--source-lang", "en", "--target-lang", "de",
        "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
        "--testpref", str(raw / "test"), "--destdir", str(dest),
        "--joined-dictionary", "--workers", "1",
    ], cwd=raw)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(tool: str, args: List[str], world_size: int, cwd: Path, timeout: int = 600):
    """Start ``world_size`` processes of one distributed job on this machine (gloo over
    loopback) and wait for all of them."""
    port = free_port()
    env = tool_env()
    argvs = [[str(BIN / tool), *args, "--distributed-world-size", str(world_size),
              "--distributed-rank", str(rank), "--distributed-backend", "gloo",
              "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn"]
             for rank in range(world_size)]
    forks = forkserver.server(plain_tool_env())
    if forks is not None and forks.serves(argvs[0], env):
        started = [forks.start(argv, cwd, env=env) for argv in argvs]
        try:
            results = [subprocess.CompletedProcess(proc.args, proc.returncode, as_text(proc.stdout),
                                                   as_text(proc.stderr))
                       for proc in (one.wait(timeout) for one in started)]
        finally:
            for one in started:
                one.kill()
    else:
        procs = [subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for argv in argvs]
        results = []
        try:
            for proc in procs:
                out, err = proc.communicate(timeout=timeout)
                results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    for result in results:
        if result.returncode != 0:
            raise AssertionError(f"{tool} rank exited {result.returncode}:\n{result.stderr[-4000:]}")
    return results


def made_once(tmp_path_factory, worker_id: str, name: str, make: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``make(folder)`` fills, made once per test run and shared by
    every pytest-xdist worker (the first one makes it, under a lock; the others read it):
    for the results of runs of several seconds that tests only read."""
    from filelock import FileLock

    if worker_id == "master":  # not under xdist
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    folder = tmp_path_factory.getbasetemp().parent / name
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".made").exists():
            make(folder)
            (folder / ".made").touch()
    return folder


def prepared_sample(root: Path, train: int, valid: int, test: int) -> Path:
    """A binarized subset of the bundled corpus under ``root`` (raw/ and bin/)."""
    write_sample_subset(root / "raw", train=train, valid=valid, test=test)
    preprocess(root / "raw", root / "bin")
    return root


def train_error_in_process(args: List[str], monkeypatch) -> str:
    """The one line ``fairseq-train args`` stops with, run in this process: for errors that
    reach fairseq's ``call_main`` (data, precision) as for parse-time ones. Each test module
    that uses it checks the real command's output (one line, no traceback) once as a
    subprocess."""
    from fairseq_cli import train

    return cli_error_in_process("fairseq-train", train.cli_main, args, monkeypatch)


def cli_error_in_process(command: str, main, args: List[str], monkeypatch) -> str:
    """The one line fairseq's ``main`` (the ``cli_main`` of ``command``) stops with when run
    in this process on ``args``: a ``SystemExit``'s text, or the one line the command line
    prints for the exception it raised; an AssertionError when it does not fail."""
    from fairseq_hybrid.errors import hybrid_error_in

    monkeypatch.setattr(sys, "argv", [command, *args])
    try:
        main()
    except SystemExit as stopped:
        return str(stopped.code)
    except Exception as error:  # noqa: BLE001 - the command line prints it as one line
        line = hybrid_error_in(error)
        assert line is not None, f"not a one-line error: {error!r}"
        return str(line)
    raise AssertionError(f"{command} {' '.join(args)} did not fail")


def train_in_process(args: List[str], monkeypatch) -> Exception:
    """``fairseq-train args`` in this process, for a run that must stop with an error before
    any work (parse-time checks): the ``HybridConfigError`` it raised, which the command line
    prints as its one line (fairseq_patches.one_line_errors). How the real command prints it
    (one line, exit 1, no traceback) is checked once per test module as a subprocess; this
    checks each bad value's message and that nothing was written, without a new process
    (~3 s of importing torch, fairseq and its tasks each)."""
    import pytest
    from fairseq_cli import train

    from fairseq_hybrid.errors import HybridConfigError

    monkeypatch.setattr(sys, "argv", ["fairseq-train", *args])
    with pytest.raises(HybridConfigError) as raised:
        train.cli_main()
    return raised.value


def generate_error_in_process(args: List[str], monkeypatch) -> str:
    """The one line ``fairseq-generate args`` stops with, run in this process (like
    ``train_error_in_process``): for errors of its option checks and of the checkpoint it
    loads. A test module that uses it names the subprocess test that checks how the real
    command prints the same kind of error (one line, exit 1, no traceback)."""
    from fairseq_cli import generate

    return cli_error_in_process("fairseq-generate", generate.cli_main, args, monkeypatch)


def hydra_composed(config: str, overrides: Sequence[str], return_hydra_config: bool = False,
                   config_dir: Path = CONFIG_DIR):
    """The config ``fairseq-hydra-train --config-dir config_dir --config-name config
    overrides`` composes, without running it (fairseq's schema registered by ``hydra_init``;
    Hydra's version base 1.1, as under fairseq's ``@hydra.main``); with Hydra's own ``hydra``
    node (the overrides under hydra.overrides.task) if ``return_hydra_config``."""
    from fairseq.dataclass.initialize import hydra_init
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.version import VersionBase

    version_base = VersionBase.instance().getbase()
    hydra_init(config)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
            return compose(config, overrides=list(overrides), return_hydra_config=return_hydra_config)
    finally:  # process-global: fairseq's own in-process composition refuses a base >= 1.2
        VersionBase.instance().version_base = version_base
        GlobalHydra.instance().clear()


def hydra_error_in_process(config: str, overrides: Sequence[str], config_dir: Path = CONFIG_DIR) -> str:
    """The one line ``fairseq-hydra-train --config-dir config_dir --config-name config
    overrides`` stops with when the plugin's Hydra callback refuses the run, in this process:
    the config composed as that command composes it (``hydra_composed``, with the ``hydra``
    node, whose ``overrides.task`` the callback reads), then the callback
    (``HybridRunSetup.on_run_start``), which Hydra runs before it writes anything. A test
    module that uses it names the subprocess test that checks the real command (one line,
    exit 1, nothing written)."""
    from fairseq_hybrid.plugin.hydra_callback import HybridRunSetup

    composed = hydra_composed(config, overrides, return_hydra_config=True, config_dir=config_dir)
    try:
        HybridRunSetup().on_run_start(composed)
    except SystemExit as stopped:
        return str(stopped.code)
    raise AssertionError(f"fairseq-hydra-train {' '.join(overrides)} was not refused")
