"""Warm interpreters for the suite's multi-rank runs: ``warm_cli(args)`` runs ``tzrec-run ARGS
--nproc-per-node 2`` as ``run_cli`` does (the real launcher, torchrun's real agent, real ranks
talking over gloo), but each of those processes starts as a fork of a server that has already
imported torch, TorchRec, FBGEMM and tzrun, instead of a fresh interpreter that spends about
4 s of CPU importing them. On this 2-core machine that is most of a small 2-rank run.

How: the server (``python -m tests.warm_ranks serve SOCKET CLIENT``) writes CLIENT, a
stand-in for the Python executable (``sys.executable`` in the processes it forks), so that the
launcher starts torchrun's agent and the agent starts the ranks through it. CLIENT is a small
script without site-packages: it hands the server its arguments, environment, working directory
and standard streams (the file descriptors themselves), forwards the signals it receives to the
forked process, and exits as that process exited (its code, or killed by the same signal); so
the launcher and torchrun see an ordinary child. A fork does what an interpreter's start would
for the environment it was given (``PYTHONPATH``, ``OMP_NUM_THREADS``, ``PYTHONFAULTHANDLER``,
fresh random seeds), then runs ``-m MODULE`` or ``-c CODE`` as ``__main__`` and the exit
handlers.

Two servers per test process, so that rank 1 and its peers do not share rank 0's ``str`` hash
seed (in a real launch every rank has its own; a set's order may differ across ranks).

What stays different from real processes, and so stays with ``run_cli``: the forks are children
of their server, not of the client (the parent-death signal of a rank follows the server; the
launcher's orphan reaping has nothing to reap; a fork leads a session of its own), so the tests
of what happens to the launcher or to torchrun's agent (a signal or SIGKILL to either, Ctrl-C
at a terminal) use real launches; so do memory-cap tests (a fork starts with the server's
pages). A fault inside a rank (tests/integration/fault_plugin.py: a rank that raises, freezes,
signals or SIGKILLs itself) runs warm: the client exits as its fork did, killed by the same
signal, so torchrun's agent sees what it would see of a real rank, and the fault plugin's
directory on ``PYTHONPATH`` is read by the fork's plugin manager as by a fresh interpreter's.
Nothing here can hang a test: a client whose server is gone exits 70 at once, a fork whose
client is gone is killed, and a server whose test process is gone kills its forks and exits.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
_LENGTH = 8
_PR_SET_PDEATHSIG = 1
#: the pids a process compares with its parent's: torchrun's, named by it to its ranks
#: (tzrun.runner.launch.stop_with_agent), and the launcher's, named to torchrun
#: (tzrun.cli.agent, which otherwise cleans up after a launcher it thinks is gone); a fork's
#: parent is its server
_PARENT_PID_ENVS = ("TZRUN_AGENT_PID", "TZRUN_LAUNCHER_PID")
#: which server a client asks (default: its RANK); not passed on to the fork
_SLOT_ENV = "TZRUN_WARM_SLOT"

_CLIENT = r'''#!{python} -IS
# a stand-in for python, written by tests/warm_ranks.py: the server forks the process
import json, os, signal, socket, sys
SOCKETS = {sockets!r}

def main():
    rank = os.environ.get("TZRUN_WARM_SLOT") or os.environ.get("RANK", "0")
    path = SOCKETS[int(rank) % len(SOCKETS)] if rank.isdigit() else SOCKETS[0]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.connect(path)
    except OSError as error:
        sys.stderr.write("warm python: no server at %s (%s)\n" % (path, error))
        os._exit(70)
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    body = json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
    message = len(body).to_bytes({length}, "big") + body
    sent = socket.send_fds(server, [message[:1]], fds)
    server.sendall(message[sent:])
    reply = server.makefile("r")
    pid = int(reply.readline() or 0)
    if not pid:
        sys.stderr.write("warm python: the server at %s did not start the process\n" % path)
        os._exit(70)

    def forward(number, frame):
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(number, forward)
    line = reply.readline()
    if not line:
        sys.stderr.write("warm python: the server at %s went away\n" % path)
        os._exit(70)
    code = os.waitstatus_to_exitcode(int(line))
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)

main()
'''


# --- in the test process ---------------------------------------------------------------------

_servers: list[subprocess.Popen] = []
_client: Path | None = None


def warm_cli(args: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``run_cli(args)`` with the launcher, torchrun's agent and the ranks forked from warm
    servers (started on the first call, ended with the test process)."""
    return warm_python(["-m", "tzrun", *args], timeout=timeout, env=env)


def warm_python(argv: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` (``-m MODULE ...`` or ``-c CODE ...``) forked from a warm server, run
    in the repository with ``env`` added to this process's environment; output captured."""
    full_env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    return subprocess.run([str(warm_executable()), *argv], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=REPO)


def warm_spawn(fn: Callable[..., object], args: tuple = (), nprocs: int = 2, timeout: float = 300) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` with warm processes: ``fn(rank,
    *args)`` in ``nprocs`` forks at once (``fn`` a module-level function, ``args`` picklable);
    an AssertionError with the output of every process that failed, or of all of them after
    ``timeout`` seconds (then killed)."""
    payload = pickle.dumps((fn.__module__, fn.__qualname__, args)).hex()
    code = ("import importlib, pickle, sys\n"
            "module, name, args = pickle.loads(bytes.fromhex(sys.argv[2]))\n"
            "target = importlib.import_module(module)\n"
            "for part in name.split('.'):\n"
            "    target = getattr(target, part)\n"
            "target(int(sys.argv[1]), *args)\n")
    with tempfile.TemporaryDirectory(prefix="tzrun-warm-spawn-") as out:
        procs = []
        for rank in range(nprocs):
            log = open(Path(out, f"rank-{rank}.log"), "w+")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([str(warm_executable()), "-c", code, str(rank), payload], stdout=log,
                                           stderr=subprocess.STDOUT, cwd=REPO,
                                           env={**os.environ, "PYTHONFAULTHANDLER": "1", _SLOT_ENV: str(rank)}), log))
        deadline = time.monotonic() + timeout
        failed = []
        for rank, (proc, log) in enumerate(procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other, _ in procs:
                    other.kill()
                proc.wait()
            log.seek(0)
            if proc.returncode != 0:
                failed.append(f"rank {rank} exited with {proc.returncode}:\n{log.read()[-4000:]}")
            log.close()
        assert not failed, "\n".join(failed)


def warm_executable() -> Path:
    """The stand-in for ``python`` whose processes the warm servers fork (they start on the
    first call; a server that died is replaced)."""
    return _started()


def _started() -> Path:
    global _client
    if _client is not None and all(server.poll() is None for server in _servers):
        return _client
    _stop()
    directory = Path(tempfile.mkdtemp(prefix="tzrun-warm-"))
    sockets = [str(directory / f"server-{i}.sock") for i in range(2)]
    client = directory / "python"
    client.write_text(_CLIENT.format(python=sys.executable, sockets=sockets, length=_LENGTH))
    client.chmod(0o755)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a fork sets its own from its environment
    for path in sockets:
        _servers.append(subprocess.Popen([sys.executable, "-m", "tests.warm_ranks", "serve", path, str(client)],
                                         cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE))
    for server in _servers:
        ready = server.stdout.readline()
        assert ready == b"ready\n", f"a warm server did not start (exit {server.wait()})"
    _client = client
    return client


def _stop() -> None:
    global _client
    for server in _servers:
        server.terminate()
    for server in _servers:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    _servers.clear()
    _client = None


atexit.register(_stop)


# --- the server ------------------------------------------------------------------------------


def _preload() -> None:
    """What every process of a launch imports (its start-up is what the forks save)."""
    import torch  # noqa: F401
    import torch.distributed.run  # noqa: F401  - torchrun's agent
    import fbgemm_gpu  # noqa: F401
    import torchrec  # noqa: F401
    import tzrun.cli.agent  # noqa: F401
    import tzrun.cli.main  # noqa: F401
    import tzrun.runner.session  # noqa: F401
    import tzrun.runner.trainer  # noqa: F401
    # what a run imports later: torchmetrics (with the scipy, matplotlib and pandas it pulls in,
    # about 2.6 s), the optimizers, and every installed plugin's modules (the plugin manager
    # itself is made again by each process)
    import pandas  # noqa: F401
    import torch.distributed.optim  # noqa: F401
    import torchmetrics  # noqa: F401
    from tzrun.kernel.plugins import make_plugin_manager

    make_plugin_manager()

    # torch's loggers hold the standard error of the time they were made; in a fresh process
    # that is the one the process has when it imports torch (torchrun's agent redirects it
    # first: tzrun.cli.agent), so here they write to whatever sys.stderr is when they write
    import logging

    # FBGEMM's import logs through the root logger, which gives it a handler of the default
    # format; in a fresh process tzrec-run configures the root logger before that import
    for handler in list(logging.root.handlers):
        logging.root.removeHandler(handler)
    for logger in [logging.root, *logging.root.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                handler.stream = _CurrentStderr()


class _CurrentStderr:
    """A stream that is ``sys.stderr`` at the time of each call."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def serve(path: str, client: str) -> None:
    """Accept clients on the Unix socket ``path`` and fork a process for each (see the module)."""
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    parent = os.getppid()
    forks: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its client)

    def end(number: int, frame: object) -> None:
        for pid, _ in forks.values():
            _kill(pid)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    _preload()
    real_python = sys.executable
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                pid = _fork(request, fds, real_python, client, [listener, selector, conn, *(c for _, c in forks.values())],
                            list(forks))
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                pidfd = os.pidfd_open(pid)
                forks[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ)
                selector.register(conn, selectors.EVENT_READ, pidfd)
            elif isinstance(key.fileobj, int):  # a fork ended
                pidfd = key.fileobj
                pid, conn = forks.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                selector.unregister(pidfd)
                if conn in (k.fileobj for k in selector.get_map().values()):
                    selector.unregister(conn)
                os.close(pidfd)
                try:
                    conn.sendall(f"{status}\n".encode())
                except OSError:
                    pass
                conn.close()
            else:  # a client sent nothing more: it is gone, so is its fork
                try:
                    gone = not key.fileobj.recv(1)
                except OSError:
                    gone = True
                if gone:
                    selector.unregister(key.fileobj)
                    _kill(forks[key.data][0])
        if os.getppid() != parent:
            end(signal.SIGTERM, None)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    if len(fds) != 3:
        raise ValueError(f"expected 3 file descriptors, got {len(fds)}")
    while len(data) < _LENGTH or len(data) < _LENGTH + int.from_bytes(data[:_LENGTH], "big"):
        more = conn.recv(65536)
        if not more:
            raise ValueError("the client went away")
        data += more
    return json.loads(data[_LENGTH:]), fds


def _fork(request: dict, fds: list[int], real_python: str, client: str, server_files: list, pidfds: list[int]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        for item in server_files:
            item.close()
        for pidfd in pidfds:
            os.close(pidfd)
        code = _run_forked(request, fds, real_python, client)
    except BaseException:  # noqa: BLE001 - this process must end here, whatever happened
        import traceback

        traceback.print_exc()
        code = 1
    os._exit(code)


def _run_forked(request: dict, fds: list[int], real_python: str, client: str) -> int:
    """In the fork: become the process the client would have started, run it, return its code."""
    import io
    import random

    os.setsid()
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = {k: v for k, v in request["env"].items() if k != _SLOT_ENV}
    os.environ.clear()
    os.environ.update(env)
    for name in _PARENT_PID_ENVS:
        if name in env:
            os.environ[name] = str(os.getppid())
    os.chdir(request["cwd"])
    argv = list(request["argv"])
    unbuffered = "PYTHONUNBUFFERED" in env
    while argv and argv[0] in ("-u", "-B", "-E", "-s"):
        unbuffered |= argv.pop(0) == "-u"
    if len(argv) < 2 or argv[0] not in ("-m", "-c"):
        sys.stderr.write(f"warm python: only -m MODULE and -c CODE run here, not {argv}\n")
        return 2
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False), encoding="utf-8")  # noqa: SIM115
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),  # noqa: SIM115
                                                   encoding="utf-8", write_through=unbuffered)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), encoding="utf-8",  # noqa: SIM115
                                                   errors="backslashreplace", write_through=True)
    # what an interpreter's start does with the environment it is given
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path.insert(0, os.getcwd() if argv[0] == "-m" else "")
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if env.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    # a rank starts no launch of its own: its children (data workers, spawned checks) are real
    sys.executable = real_python if "LOCAL_RANK" in env else client
    return _as_main(argv)


def _as_main(argv: list[str]) -> int:
    """Run ``-m MODULE ARGS`` or ``-c CODE ARGS`` as ``__main__``, then the exit handlers, as
    the interpreter does; the exit code."""
    import atexit as exits
    import runpy
    import threading
    import traceback

    mode, target, *rest = argv
    code, interrupted = 0, False
    try:
        if mode == "-m":
            sys.argv = ["-m", *rest]
            sys.modules.pop(target, None)  # (imported by the server) runs as __main__ alone, as in a fresh process
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *rest]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    except SystemExit as error:
        code = _exit_code(error.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # noqa: SLF001 - what the interpreter does before the exit handlers
    exits._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
        return 130
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3])
