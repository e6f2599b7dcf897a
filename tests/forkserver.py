"""fairseq's command-line tools started for the tests as forks of a process that has
imported torch and fairseq already, instead of fresh interpreters: ~3 s of imports, most
of a short test command's time, paid once per pytest worker instead of once per command.

``cli.run_tool`` and ``cli.run_ranks`` start their commands through ``ForkServer.run``; the
server is ``python tests/forkserver.py SOCKET``, started once per pytest process. Each
command is still a process of its own (its own pid, exit status, signals, working directory,
environment and standard streams, which the client hands over as file descriptors), running
the tool's own console script with ``runpy`` as the interpreter would. What a fork could
change, and how it is kept equal:

- *the environment at start-up*: Python, the locale and OpenMP read some variables when the
  interpreter starts; the server serves only commands whose environment is exactly the one
  it was started with (``tool_env``), every other command is an ordinary subprocess;
- *logging*: a tool module that configures logging before it imports fairseq
  (``fairseq_cli.train``, ``interactive``, ``preprocess``) gets an unconfigured root logger,
  as in a fresh process; the others (``generate``, ``hydra_train``) keep the configuration
  fairseq's own import made (a module of it calls ``logging.basicConfig``), as in a fresh
  process. The one difference: fairseq's import-time INFO line about tensorboardX is not
  printed;
- *imports*: the server imports torch and fairseq only; the plugin (``--user-dir``), the
  tool's module and everything else are imported by the command itself.

``FAIRSEQ_HYBRID_TEST_FORKS=0`` turns it off (every command a fresh interpreter), and so
does ``make coverage``, which measures each command from its interpreter's start.
"""
from __future__ import annotations

import ast
import atexit
import importlib.util
import json
import logging
import os
import runpy
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HEADER = struct.Struct("!Q")  # the length of the JSON request that follows
# variables no interpreter, library or tool reads at start-up: they may differ between the
# server's environment and a command's (pytest sets this one for each test)
RUN_TIME_ONLY = {"PYTEST_CURRENT_TEST"}


def same_start(env: Dict[str, str], server_env: Dict[str, str]) -> bool:
    """Whether a command with ``env`` would start as the server did."""
    return ({k: v for k, v in env.items() if k not in RUN_TIME_ONLY}
            == {k: v for k, v in server_env.items() if k not in RUN_TIME_ONLY})


def _send(conn: socket.socket, message: Dict, fds: Tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    payload = HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(conn, [payload], list(fds))
        conn.sendall(payload[sent:])
    else:
        conn.sendall(payload)


def _receive(conn: socket.socket, max_fds: int = 0) -> Tuple[Optional[Dict], List[int]]:
    if max_fds:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, max_fds)
    else:
        data, fds = conn.recv(1 << 16), []
    if not data:
        return None, fds
    while len(data) < HEADER.size:
        data += conn.recv(1 << 16)
    (length,) = HEADER.unpack(data[:HEADER.size])
    data = data[HEADER.size:]
    while len(data) < length:
        more = conn.recv(1 << 16)
        if not more:
            return None, fds
        data += more
    return json.loads(data[:length]), fds


def configures_logging_first(script: str) -> bool:
    """Whether the module a console script runs calls ``logging.basicConfig`` at module
    level before it imports fairseq (then a fresh process has fairseq's import-time call
    find the root logger configured already)."""
    text = Path(script).read_text()
    tree = ast.parse(text)
    module = next((node.module for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fairseq_cli.")), None)
    if module is None:
        return False
    spec = importlib.util.find_spec(module)
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func) == "logging.basicConfig":
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(name == "fairseq" or name.startswith("fairseq.") for name in names):
                return False
    return False


def serve(socket_path: str) -> Tuple[Dict, List[int]]:
    """The server's loop; returns only in a forked child: the request it is to run."""
    import fairseq  # noqa: F401 - the imports every command would repeat (torch with it)
    import torch  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    parent = os.getppid()
    print("ready", flush=True)
    children: Dict[int, socket.socket] = {}
    while os.getppid() == parent:  # the pytest process that started it is alive
        if select.select([listener], [], [], 0.02)[0]:
            conn, _ = listener.accept()
            request, fds = _receive(conn, max_fds=3)
            if request is None or len(fds) != 3:
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            _send(conn, {"pid": pid})
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass  # the client gave up (its timeout)
            conn.close()
    sys.exit(0)


def become(request: Dict, fds: List[int]) -> None:
    """In the forked child: take the command's streams, directory, environment and
    arguments, and run its console script as the interpreter would."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["fresh_logging"]:
        for handler in list(logging.root.handlers):
            logging.root.removeHandler(handler)
        logging.root.setLevel(logging.WARNING)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


class ForkServer:
    """The client: one server per pytest process, started on first use with ``env``."""

    def __init__(self, env: Dict[str, str]):
        self.env = dict(env)
        self.folder = tempfile.mkdtemp(prefix="forks-")
        self.socket_path = os.path.join(self.folder, "server.sock")
        self.log = open(os.path.join(self.folder, "server.log"), "wb")
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.socket_path], env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self.log, cwd=self.folder)
        if self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the fork server did not start (log: {self.log.name})")
        atexit.register(self.stop)
        # per console script, read once: None if not this interpreter's, else whether its
        # module configures logging before importing fairseq
        self._scripts: Dict[str, Optional[bool]] = {}

    def _script(self, path: str) -> Optional[bool]:
        if path not in self._scripts:
            with open(path, "rb") as script:
                ours = script.readline().strip() == b"#!" + sys.executable.encode()
            self._scripts[path] = configures_logging_first(path) if ours else None
        return self._scripts[path]

    def stop(self) -> None:
        """End the server (its running commands go on) and remove its folder."""
        self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def serves(self, argv: List[str], env: Dict[str, str]) -> bool:
        """Whether ``argv`` with ``env`` runs here: a console script of this interpreter, and
        the environment the server started with (``RUN_TIME_ONLY`` aside)."""
        return same_start(env, self.env) and self.process.poll() is None and self._script(argv[0]) is not None

    def start(self, argv: List[str], cwd: Path, stdin: Optional[bytes] = None,
              env: Optional[Dict[str, str]] = None) -> "Started":
        """Start ``argv`` (a console script ``serves`` accepts) in ``cwd`` with ``env`` (the
        server's own by default), ``stdin`` on its standard input; its output captured."""
        return Started(self, argv, cwd, stdin, env or self.env)

    def run(self, argv: List[str], cwd: Path, stdin: Optional[bytes], timeout: float,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Like ``subprocess.run(argv, capture_output=True, env=env)``: bytes."""
        return self.start(argv, cwd, stdin, env).wait(timeout)


class Started:
    """One command the server forked: its pid, and its exit status and output once it ends."""

    def __init__(self, server: ForkServer, argv: List[str], cwd: Path, stdin: Optional[bytes],
                 env: Dict[str, str]):
        self.argv = argv
        self.streams = [tempfile.TemporaryFile() for _ in range(3)]
        self.streams[0].write(stdin or b"")
        self.streams[0].seek(0)
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(server.socket_path)
        _send(self.conn, {"argv": argv, "cwd": str(cwd), "env": env,
                          "fresh_logging": server._script(argv[0])},
              tuple(stream.fileno() for stream in self.streams))
        started, _ = _receive(self.conn)
        if started is None:
            raise RuntimeError(f"the fork server refused {argv[0]}")
        self.pid: int = started["pid"]
        self.ended = False

    def kill(self) -> None:
        """SIGKILL, unless it has ended (its pid may be another process's by now)."""
        if self.ended:
            return
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        self.conn.settimeout(timeout)
        try:
            ended, _ = _receive(self.conn)
        except socket.timeout:
            self.kill()
            self.conn.settimeout(None)
            _receive(self.conn)
            self.ended = True
            self.close()
            raise subprocess.TimeoutExpired(self.argv, timeout) from None
        self.ended = True
        for stream in self.streams[1:]:
            stream.seek(0)
        out, err = (stream.read() for stream in self.streams[1:])
        self.close()
        return subprocess.CompletedProcess(self.argv, ended["returncode"], out, err)

    def close(self) -> None:
        self.conn.close()
        for stream in self.streams:
            stream.close()


_SERVER: Optional[ForkServer] = None


def under_coverage() -> bool:
    """``make coverage`` measures every command from its start (coverage's subprocess
    patch): there, commands are fresh interpreters."""
    coverage = sys.modules.get("coverage")
    return coverage is not None and coverage.Coverage.current() is not None


def server(env: Dict[str, str]) -> Optional[ForkServer]:
    """This pytest process's server (started on first use), or None when turned off."""
    global _SERVER
    if os.environ.get("FAIRSEQ_HYBRID_TEST_FORKS", "1") == "0" or under_coverage():
        return None
    if _SERVER is None:
        _SERVER = ForkServer(env)
    return _SERVER


if __name__ == "__main__":
    become(*serve(sys.argv[1]))
