"""``torchrun`` of ``schedtrain train`` on the CPU (gloo), for the tests that run two real
processes (tests/distributed/, and callbacks that must agree across ranks)."""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fork_cli import fork_main, leave_child, output_to, wait

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def torchrun(spec: Path, run_dir: Path, *args: str, kill_at_line: int | None = None,
             sig: int = signal.SIGKILL, timeout: float = 120,
             nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node NPROC -m schedtrain train SPEC``; with
    ``kill_at_line``, ``sig`` goes to the launcher and both ranks once ``events.jsonl``
    has that many lines (as a scheduler would stop the job)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), "-m", "schedtrain", "train", str(spec),
           "--run-dir", str(run_dir), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a crash shows its stacks
    proc = subprocess.Popen(cmd, cwd=spec.parent, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kill_at_line is not None:
        log = run_dir / "events.jsonl"
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and log.read_text().count("\n") >= kill_at_line:
                os.killpg(proc.pid, sig)
                break
            time.sleep(0.01)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def forked_ranks(spec: Path, run_dir: Path, *args: str, nproc: int = 2,
                 timeout: float = 120, env: dict[str, str] | None = None,
                 kill_at_line: int | None = None, sig: int = signal.SIGKILL
                 ) -> subprocess.CompletedProcess[str]:
    """``schedtrain train SPEC`` as ``nproc`` ranks forked from this process, with the
    environment ``torchrun --standalone`` gives its workers (``RANK``, ``WORLD_SIZE``, a
    free ``MASTER_PORT``, ...): the same run as :func:`torchrun`'s, without three fresh
    interpreters importing torch (several seconds each on a loaded 2-core machine).

    For the tests of what the ranks agree on. What only the launcher does (its signal
    forwarding, a failed rank ending the others, elastic restarts) is tested through
    :func:`torchrun` or :class:`ForkedLauncher`. ``returncode``: the first failed
    rank's code, else 0; ``stdout`` and ``stderr``: the ranks' own, rank 0's first. Past
    ``timeout`` every rank is killed and ``subprocess.TimeoutExpired`` raised, as
    :func:`torchrun` raises it. With ``kill_at_line``, ``sig`` goes to every rank once
    ``events.jsonl`` has that many lines, as :func:`torchrun` sends it to its job (a
    rank's code is then ``-sig``, where torchrun's own is its launcher's)."""
    argv = ["train", str(spec), "--run-dir", str(run_dir), *args]
    kill = None if kill_at_line is None else (run_dir / "events.jsonl", kill_at_line, sig)
    return _ranks(argv, lambda rank_env, out, err: fork_main(
        argv, spec.parent, stdout=out, stderr=err, before=_one_thread, env=rank_env),
        nproc, timeout, env, kill=kill)


def forked_module_ranks(module: str, args: Sequence[str], cwd: Path, *, nproc: int = 2,
                        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node NPROC -m MODULE ARGS`` in ``cwd``, as
    :func:`forked_ranks` runs ``schedtrain train``: each rank runs ``MODULE`` as
    ``__main__`` (``sys.argv``: ``[MODULE, *ARGS]``) in a child forked from this process."""
    argv = ["-m", module, *args]

    def start(rank_env: dict[str, str], out: Path, err: Path) -> int:
        pid = os.fork()
        if pid == 0:
            _main_child(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True),
                        [module, *args], cwd, rank_env, out=out, err=err)
        return pid
    return _ranks(argv, start, nproc, timeout, None)


def _ranks(argv: list[str], start: Callable[[dict[str, str], Path, Path], int], nproc: int,
           timeout: float, env: dict[str, str] | None, *,
           kill: tuple[Path, int, int] | None = None) -> subprocess.CompletedProcess[str]:
    """``start(ENV, STDOUT, STDERR)`` (a forked child's pid) once per rank, then their
    codes and output, as :func:`forked_ranks` documents; ``kill``: (log, lines, signal)."""
    import torch.distributed as dist

    # A child would take the test process's group as its own (World.from_env reads it):
    # each rank a run of one, and a count of what it called would count nothing shared.
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("the test process holds a process group: its forked ranks "
                           "would inherit it instead of forming their own")
    _warm_up()
    # The ranks' store, listening before any rank starts, in this process as torchrun's
    # agent hosts it for its workers (TORCHELASTIC_USE_AGENT_STORE): hosted by rank 0, a
    # rank that came first would retry its connection after a backoff (0.6 s a run).
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    with tempfile.TemporaryDirectory() as scratch:
        outs = [(Path(scratch) / f"{rank}.out", Path(scratch) / f"{rank}.err")
                for rank in range(nproc)]
        pids = [start({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
            "TORCHELASTIC_USE_AGENT_STORE": "True", **(env or {})}, out, err)
            for rank, (out, err) in enumerate(outs)]
        until = time.monotonic() + timeout
        if kill is not None:
            _kill_at_line(pids, *kill, until)
        codes = wait(pids, until)
        out, err = ("".join(p[i].read_text(errors="replace") for p in outs if p[i].exists())
                    for i in (0, 1))
    if codes is None:
        raise subprocess.TimeoutExpired(argv, timeout, out, err)
    return subprocess.CompletedProcess(argv, next((c for c in codes if c), 0), out, err)


def _kill_at_line(pids: list[int], log: Path, lines: int, sig: int, until: float) -> None:
    """``sig`` to every process in ``pids`` once ``log`` has ``lines`` lines; none where
    one of them ended first or ``until`` (monotonic) passed. Reaps none."""
    while time.monotonic() < until:
        if log.exists() and log.read_text().count("\n") >= lines:
            for pid in pids:
                os.kill(pid, sig)  # not yet reaped: the pid is still this rank's
            return
        if any(os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
               for pid in pids):
            return
        time.sleep(0.01)


def _one_thread() -> None:
    """What ``OMP_NUM_THREADS=1``, which torchrun sets, does: set in a forked child, it
    is read too late (torch read it when the test process imported it)."""
    import torch

    torch.set_num_threads(1)


def _main_child(run: Callable[[], object], argv: list[str], cwd: Path, env: dict[str, str],
                *, out: Path, err: Path) -> None:
    """One forked rank running ``run`` (a module or script as ``__main__``, ``sys.argv``
    ``ARGV``) as a fresh interpreter would (its folder, environment, output, default
    signals), one thread; never returns into pytest."""
    import traceback

    code = 1
    try:
        os.chdir(cwd)
        os.environ.update(env)
        output_to(out, err)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        _one_thread()
        sys.argv = argv
        run()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # as the command line: its traceback, exit 1
        traceback.print_exc()
    finally:
        leave_child(code)


def forked_script_ranks(script: Path, args: Sequence[str], cwd: Path, *, nproc: int = 2,
                        timeout: float = 180, env: dict[str, str] | None = None
                        ) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node NPROC SCRIPT ARGS``'s ranks forked from
    this process (what it imported, the ranks need not import again): each runs
    ``SCRIPT`` as ``__main__`` with ``sys.argv`` and the environment torchrun gives its
    workers (``TORCHELASTIC_RUN_ID`` too: Lightning and Ignite read it to know they run
    under torchrun). As :func:`forked_ranks` for ``schedtrain train``: ``returncode`` the
    first failed rank's code, else 0; output the ranks' own, rank 0's first."""
    import uuid

    argv = [str(script), *args]
    launch = {"GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc),
              "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": uuid.uuid4().hex, **(env or {})}

    def start(rank_env: dict[str, str], out: Path, err: Path) -> int:
        pid = os.fork()
        if pid == 0:
            _main_child(lambda: runpy.run_path(str(script), run_name="__main__"), argv, cwd,
                        {**rank_env, "ROLE_RANK": rank_env["RANK"]}, out=out, err=err)
        return pid
    return _ranks(argv, start, nproc, timeout, launch)


class ForkedLauncher:
    """``torchrun ARGS`` whose launcher is forked from this process: torchrun's own
    ``main`` (its rendezvous, its agent, its signal handling), started without a fresh
    interpreter importing torch (seconds on a loaded 2-core machine); its workers are
    the fresh ``python`` processes torchrun starts. What a ``subprocess.Popen`` of
    ``python -m torch.distributed.run ARGS`` with ``start_new_session`` and piped text
    output offers the tests: ``pid``, ``poll``, ``wait``, ``communicate``,
    ``returncode`` (the command line's: 0, 1 where ``main`` raised, -N on signal N)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], *,
                 fork_workers: bool = False) -> None:
        import torch.distributed.run  # noqa: F401  (imported here, once, not in the child)

        if fork_workers:
            _warm_up()
        self._scratch = tempfile.TemporaryDirectory()
        self._outs = (Path(self._scratch.name) / "out", Path(self._scratch.name) / "err")
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            _launcher_child(args, cwd, env, *self._outs, fork_workers=fork_workers)

    def poll(self) -> int | None:
        if self.returncode is None:
            got, status = os.waitpid(self.pid, os.WNOHANG)
            if got:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if until is not None and time.monotonic() > until:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        out, err = (p.read_text(errors="replace") if p.exists() else "" for p in self._outs)
        self._scratch.cleanup()
        return out, err


def _launcher_child(args: list[str], cwd: Path, env: dict[str, str], out: Path,
                    err: Path, *, fork_workers: bool = False) -> None:
    """The forked launcher: a session of its own, ``env`` as its whole environment (its
    workers inherit it), output to ``out`` and ``err``, signals as a fresh process has
    them; then torchrun's ``main`` (with ``fork_workers``: see :func:`_fork_workers`).
    Never returns into pytest."""
    import faulthandler
    import gc
    import logging
    import traceback

    code = 1
    try:
        gc.freeze()  # a collection never walks (and so copies) the test process's heap
        os.setsid()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        output_to(out, err)
        faulthandler.enable(sys.stderr)  # SIGABRT prints its stack, as PYTHONFAULTHANDLER
        logging.root.handlers.clear()  # pytest's capture: torchrun's lines go to stderr
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        from torch.distributed.run import main

        if fork_workers:
            _fork_workers()
        main(args)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # as the command line: its traceback, exit 1
        traceback.print_exc()
    finally:
        leave_child(code)


def _fork_workers() -> None:
    """Make this launcher's torchrun start its ``-m schedtrain ...`` workers as its
    function entry point does (``elastic_launch`` with a callable, ``start_method``
    "fork"): each worker forked from the launcher, torch and the package imported,
    instead of a fresh ``python -u -m schedtrain ...`` importing them again (seconds
    each). torchrun's agent still starts, watches, signals and restarts them, with the
    environment it gives each (``_wrap`` sets it); a worker ends as the command would:
    the code ``main`` returns. ``/proc/PID/environ`` no longer shows a worker's
    ``RANK``: each writes its pid to ``worker-rank<RANK>-attempt<N>.pid`` in the
    launcher's folder."""
    import torch.distributed.run as torchrun_module

    launch = torchrun_module.elastic_launch  # type: ignore[attr-defined]

    def worker(*argv: str) -> None:
        import torch

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)  # the agent's handlers, not a fresh one's
        torch.set_num_threads(1)  # OMP_NUM_THREADS, read too late
        Path(f"worker-rank{os.environ['RANK']}-attempt"
             f"{os.environ['TORCHELASTIC_RESTART_COUNT']}.pid").write_text(str(os.getpid()))
        from schedtrain.cli.main import main

        code = main(list(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        if code:
            sys.exit(code)

    def forked(config: object, entrypoint: object) -> object:
        def start(*cmd_args: str) -> object:
            assert list(cmd_args[:3]) == ["-u", "-m", "schedtrain"], cmd_args
            config.start_method = "fork"  # type: ignore[attr-defined]
            return launch(config=config, entrypoint=worker)(*cmd_args[3:])  # type: ignore[arg-type]
        return start

    torchrun_module.elastic_launch = forked  # type: ignore[attr-defined,assignment]


def _warm_up() -> None:
    """Import, once in this process, what every rank imports, so forked ranks start at
    once instead of each importing it again."""
    import torch.distributed.checkpoint
    import torch.distributed.fsdp

    import schedtrain.callbacks
    import schedtrain.cli.main
    import schedtrain.distributed
    import schedtrain.training  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo
