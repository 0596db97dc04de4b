"""Nodes that share only an object store: every rank resumes the checkpoint the chief
picks, and two "nodes" (two torchrun launchers on one machine, each with its own run
directory) with checkpoints on a real S3 server (moto) train, and resume after a node's
``kill -9``, exactly as one node with two processes does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torchrun_helpers import ForkedLauncher, forked_ranks
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every
from schedtrain.callbacks import ModelSaver
from schedtrain.checkpoints import CheckpointError
from schedtrain.training import Trainer


class _Rank:
    """A rank's agreement with its chief, in one process: ``broadcast`` hands back what
    the chief said (or, on the chief, records what it says)."""

    def __init__(self, rank: int, said: Any = None) -> None:
        self.rank, self.size, self.is_chief, self.said = rank, 2, rank == 0, said
        self.sent: list[Any] = []

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self.sent.append(obj)
        return obj if self.is_chief else self.said


def _trainer(run_dir: Path, **kw: Any) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([4] * 6), torch.nn.functional.mse_loss,
                   schedule=Schedule({"save": every(4, "steps")}),
                   bindings={"save": ModelSaver(keep=10)}, device="cpu",
                   run_dir=run_dir, handle_signals=False, checkpoint_mode="sync", **kw)


@pytest.mark.parametrize("said", [None, "step-00000004.pt", "step-00000008.pt"])
def test_a_rank_resumes_the_checkpoint_its_chief_picked(tmp_path: Path, said: str | None
                                                        ) -> None:
    """A non-chief rank resumes the checkpoint named by the chief's broadcast, whatever
    its own view of the folder would pick (here: step 8), and starts over when the chief
    found none; the chief says the name of the one it picked."""
    _trainer(tmp_path, max_steps=10).fit()
    checkpoints = tmp_path / "checkpoints"
    other = _trainer(tmp_path, max_epochs=4)
    rank = _Rank(1, said)
    found = other._run.parts.checkpoints.mount.pick_to_resume(checkpoints, rank)  # type: ignore[arg-type]
    assert rank.sent == [None]
    assert found == (None if said is None else (checkpoints / said, None))
    chief = _Rank(0)
    picked = other._run.parts.checkpoints.mount.pick_to_resume(checkpoints, chief)  # type: ignore[arg-type]
    assert picked is not None and picked[0].name == "step-00000008.pt"
    assert chief.sent == ["step-00000008.pt"]


def test_a_rank_fails_with_its_chief_when_the_chief_cannot_pick(tmp_path: Path) -> None:
    """The chief's failure to list the folder is every rank's: the chief raises its own
    error after telling the others, which raise one naming the chief (none waits)."""
    _trainer(tmp_path, max_steps=10).fit()
    trainer = _trainer(tmp_path, max_epochs=4)
    mount = trainer._run.parts.checkpoints.mount

    def broken(*_: Any) -> None:
        raise CheckpointError(tmp_path, "the store does not answer")

    mount.newest_to_resume = broken  # type: ignore[method-assign,assignment]
    chief = _Rank(0)
    with pytest.raises(CheckpointError, match="does not answer"):
        mount.pick_to_resume(tmp_path / "checkpoints", chief)  # type: ignore[arg-type]
    assert chief.sent == [""]
    with pytest.raises(CheckpointError, match="the chief could not pick"):
        mount.pick_to_resume(tmp_path / "checkpoints", _Rank(1, ""))  # type: ignore[arg-type]


# -- two "nodes" on one machine --------------------------------------------------------------

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
#: Seconds one launch (both nodes) may take before its processes' stacks are dumped and
#: it fails: about 10 s on a quiet 2-core machine, minutes on a busy one.
DEADLINE = 300.0
#: Seconds the node that was not killed gets to exit on its own once the killed one is
#: gone: its worker fails at its next collective; a launcher whose rendezvous store was
#: on the lost node waits for it to rejoin (up to torchrun's join_timeout, 600 s), and
#: is ended, workers and all, as a job scheduler would.
GRACE = 15.0
#: Seconds a surviving launcher gets to exit on its own once it has no worker left
#: (nothing of it writes to the bucket then): sooner than ``GRACE`` where its worker
#: ended first, as it does when the rendezvous' store was on the lost node.
SETTLE = 1.0
#: The last launch's (stdout, stderr) of each node.
OUTPUTS: list[tuple[str, str]] = []

SPEC = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = 3
seed = 1
checkpoint_dir = "{url}"

[run.storage_options]
client_kwargs = {{ endpoint_url = "{endpoint}" }}

[callbacks.rank]
type = "jobs.ddp:RankMetric"
trigger = {{ every = "3 steps" }}

[callbacks.high]
type = "jobs.ddp:RankMetric"
trigger = {{ all = [{{ every = "1 step" }}, {{ if = "rank/value > 0.4" }}] }}

[callbacks.save]
type = "ModelSaver"
keep = 2
trigger = {{ any = [{{ every = "5 steps" }}, {{ on = "train_end" }}] }}

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = {{ any = [{{ every = "100 samples" }}, {{ on = "train_end" }}] }}

[callbacks.slow]
type = "jobs.ddp:Sleep"
seconds = 0.02
trigger = {{ every = "1 step" }}

[callbacks.kill]
type = "jobs.ddp:KillNode"
trigger = {{ every = "1 step" }}
"""


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(kill: tuple[int, int] | None = None) -> dict[str, str]:
    """The launch's environment; ``kill`` = (rank, step): that rank's node kills itself
    at the end of that step (``jobs.ddp:KillNode``)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "SCHEDTRAIN_TEST_KILL"}
    if kill is not None:
        env["SCHEDTRAIN_TEST_KILL"] = f"{kill[0]}:{kill[1]}"
    return {**env, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
            "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1",  # SIGABRT prints stacks
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


def launch(spec: Path, folder: Path, *args: str, kill: tuple[int, int] | None = None,
           fresh: bool = False) -> list[Any]:
    """One ``torchrun --nnodes 2 --node-rank R --rdzv-backend c10d`` per node, each with
    its own run directory ``folder/nodeR/run``; torchrun's rendezvous orders nodes by
    address, so ``--local-addr 127.0.0.(R+1)`` makes node 0 the chief's (rank R runs on
    node R). ``kill`` = (node, step): that node's worker ``kill -9``s its launcher and
    itself at the end of that step. Each launcher is torchrun's ``main`` forked from
    this process, its worker forked by torchrun's agent (``ForkedLauncher`` with
    ``fork_workers``: no fresh interpreter importing torch); ``fresh``: the command
    line in a fresh interpreter, its workers too, as a job script runs it."""
    import subprocess
    import sys

    port, procs = _port(), list[Any]()
    for r in range(2):
        where = ["--nnodes", "2", "--node-rank", str(r), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", f"127.0.0.{r + 1}",
                 "--nproc-per-node", "1"]
        (folder / f"node{r}").mkdir(parents=True, exist_ok=True)
        cmd = [*where, "-m", "schedtrain", "train", str(spec),
               "--run-dir", str(folder / f"node{r}" / "run"), *args]
        if not fresh:
            procs.append(ForkedLauncher(cmd, folder, _env(kill), fork_workers=True))
            continue
        procs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *cmd],
                                      cwd=folder, env=_env(kill), text=True,
                                      start_new_session=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    return procs


def one_node(spec: Path, folder: Path) -> None:
    """The reference: one node with two processes (``forked_ranks``: torchrun
    ``--standalone --nproc-per-node 2``'s ranks, forked from this process) in
    ``folder/node0/run``."""
    (folder / "node0").mkdir(parents=True, exist_ok=True)
    creds = {k: v for k, v in _env().items() if k.startswith("AWS_")}
    got = forked_ranks(spec, folder / "node0" / "run", env=creds, timeout=DEADLINE)
    assert got.returncode == 0, got.stderr[-3000:]


def finish(procs: list[Any], *, killed: int | None = None) -> list[int]:
    """Wait for every node's launcher. Once node ``killed``'s launcher is gone (the
    launch's ``kill``), the others get ``GRACE`` seconds to exit (``SETTLE`` once no
    worker of theirs is left), then are ended with their workers. Past ``DEADLINE``
    every process prints its stack (SIGABRT) and the test fails with them. Returns the
    exit codes."""
    import os
    import signal
    import time

    deadline, lost, idle = time.monotonic() + DEADLINE, None, None
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if lost is None and killed is not None and procs[killed].poll() is not None:
            lost = time.monotonic()
        if lost is not None and idle is None and not any(
                _children(p.pid) for p in procs if p.poll() is None):
            idle = time.monotonic()
        if lost is not None and (time.monotonic() > lost + GRACE or (
                idle is not None and time.monotonic() > idle + SETTLE)):
            for p in procs:  # the job is over: the scheduler ends what is left of it
                if p.poll() is None:
                    _end_node(p.pid)
                    p.wait(timeout=30)
        time.sleep(0.05)
    hung = [p for p in procs if p.poll() is None]
    for p in hung:
        for pid in (p.pid, *_children(p.pid)):
            os.kill(pid, signal.SIGABRT)
    outs = [p.communicate(timeout=30) for p in procs]
    OUTPUTS[:] = outs
    if hung:
        pytest.fail("a launch passed its deadline; its stacks:\n" + "\n".join(
            err[-4000:] for _, err in outs))
    return [p.returncode for p in procs]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a launcher's workers: torchrun starts each
    in a session of its own, so the launcher's process group does not hold them)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # not a process, or gone
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _end_node(pid: int) -> None:
    """``kill -9`` of a launcher and its workers, as a scheduler ends a node's job."""
    import contextlib
    import os
    import signal

    for child in [pid, *_children(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def _status(folder: Path) -> str:
    import json

    return str(json.loads((folder / "node0" / "run" / "run.json").read_text())["status"])


def _bucket(endpoint: str, name: str | None = None) -> Any:
    """The server's filesystem, with bucket ``name`` made on it."""
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, key="testing",
                           secret="testing", skip_instance_cache=True)
    if name is not None:
        fs.mkdir(name)
    return fs


def _spec(folder: Path, url: str, endpoint: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.toml"
    spec.write_text(SPEC.format(url=url, endpoint=endpoint))
    return spec


def _events(run_dir: Path) -> list[dict[str, object]]:
    import json

    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")}
            for r in rows]


def _stored(url: str, endpoint: str) -> dict[str, dict[str, Any]]:
    """Every committed checkpoint in ``url``, read and checked."""
    from schedtrain.checkpoints.remote_shards import Remote, read_remote
    from schedtrain.checkpoints.storage import FsspecStorage
    from schedtrain.checkpoints.store import read_stored

    storage = FsspecStorage(url, {"client_kwargs": {"endpoint_url": endpoint},
                                  "key": "testing", "secret": "testing"})
    return {name: read_remote(Remote(storage, name)) if name.endswith(".dcp")
            else read_stored(storage, name) for name in sorted(storage.committed())}


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_same_firings(ref: Path, folder: Path) -> None:
    """Each rank's firings (``trainer.firings``: those of its last launch) are the
    reference's, from where that launch resumed."""
    import json
    import re

    resumed = re.search(r"resumed from \S+ at step (\d+)", OUTPUTS[0][1] if OUTPUTS else "")
    for r in (0, 1):
        mine = json.loads((folder / f"node{r}" / f"firings-rank{r}.json").read_text())
        want = json.loads((ref / "node0" / f"firings-rank{r}.json").read_text())
        after = [f for f in want if resumed is None or f[2] > int(resumed[1])]
        assert len(mine) >= len(after) and mine == want[len(want) - len(mine):], r


def assert_same_run(ref: Path, ref_url: str, folder: Path, url: str, endpoint: str) -> None:
    """The chief's log and both ranks' firings equal the reference's, and the bucket holds
    the same checkpoints with the same weights, optimizer state and position."""
    assert _events(folder / "node0" / "run") == _events(ref / "node0" / "run")
    assert not (folder / "node1" / "run" / "events.jsonl").exists()  # the chief's only
    assert_same_firings(ref, folder)
    want, got = _stored(ref_url, endpoint), _stored(url, endpoint)
    # A node lost, the other may still commit a checkpoint as it stops (its preemption
    # checkpoint when torchrun sends it SIGTERM, the save in flight): kept besides, as
    # on one node (no saver prunes what it did not record).
    assert want and set(want) <= set(got), (list(want), list(got))
    for name in want:
        for key in ("model", "optimizer", "step", "epoch", "phase"):
            _same(want[name][key], got[name][key], f"{name}.{key}")


@pytest.fixture(scope="module")
def reference(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, str]:
    """The reference, one node with two processes, its checkpoints in the bucket's
    ``one-node`` folder (a fixture of its own: the kill test needs no two-node run)."""
    _bucket(s3_endpoint, "multinode")
    ref = tmp_path_factory.mktemp("multinode") / "one-node"
    one_node(_spec(ref, "s3://multinode/one-node", s3_endpoint), ref)
    return ref, s3_endpoint


@pytest.fixture(scope="module")
def two_runs(reference: tuple[Path, str]) -> tuple[Path, Path, str]:
    """The reference and the same spec on two nodes, each with its checkpoints in its
    own folder of one bucket."""
    ref, s3_endpoint = reference
    two = ref.parent / "two-nodes"
    spec = _spec(two, "s3://multinode/two-nodes", s3_endpoint)
    assert finish(launch(spec, two, fresh=True)) == [0, 0]
    return ref, two, s3_endpoint


@pytest.mark.slow
def test_two_nodes_sharing_a_bucket_run_as_one_node_with_two_processes(
        two_runs: tuple[Path, Path, str]) -> None:
    """Two launchers, separate run directories, checkpoints in the bucket: the log (on
    the chief's node only), each rank's firings and every kept checkpoint equal the
    one-node run's."""
    ref, two, endpoint = two_runs
    assert_same_run(ref, "s3://multinode/one-node", two, "s3://multinode/two-nodes",
                    endpoint)


#: (node killed, a save's step): either node, killed at the end of the step after that
#: save's: the save asked for at a step is written once the step's event is over, after
#: the previous save is collected and committed, so each kill follows the commit of the
#: save before (each launch resumes from a later checkpoint than the last) and may cut
#: this one's background write short (what it left in the bucket is never resumed).
TRIALS = ((1, 10), (0, 15), (1, 20))


def _resumed(at_least: int) -> bool:
    """Whether the last launch's chief resumed from the bucket at step ``at_least`` or
    later (the last committed save before the previous kill, or a checkpoint the
    surviving node committed as it stopped)."""
    import re

    found = re.search(r"resumed from s3://\S+/step-(\d+)", OUTPUTS[0][1])
    return found is not None and int(found[1]) >= at_least


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_node_killed_then_both_resumed_runs_as_one_node(
        reference: tuple[Path, str], tmp_path: Path) -> None:
    """``kill -9`` of one node's launcher and worker, three times (either node, at
    varied steps), each followed by ``--resume auto`` on both nodes: the finished run
    equals the uninterrupted one-node run; what a killed write left in the bucket is
    never resumed from."""
    ref, endpoint = reference
    spec = _spec(tmp_path, "s3://multinode/killed", endpoint)
    for i, (node, step) in enumerate(TRIALS):
        codes = finish(launch(spec, tmp_path, "--resume", "auto", kill=(node, step + 1)),
                       killed=node)
        assert codes[node] == -9 and codes[1 - node] != 0, codes
        assert _status(tmp_path) != "finished"  # killed while it trained
        assert i == 0 or _resumed(TRIALS[i - 1][1] - 5), OUTPUTS[0][1][-2000:]
    assert finish(launch(spec, tmp_path, "--resume", "auto")) == [0, 0]
    assert _resumed(TRIALS[-1][1] - 5), OUTPUTS[0][1][-2000:]
    assert_same_run(ref, "s3://multinode/one-node", tmp_path, "s3://multinode/killed",
                    endpoint)


def _full_states(url: str, endpoint: str, scratch: Path) -> dict[str, Any]:
    """Each committed sharded checkpoint in ``url``: its step and phase, and its model and
    optimizer states as full tensors (its folder copied from the bucket, then read with
    plain PyTorch as docs/checkpoints.md says)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    fs = _bucket(endpoint)
    out: dict[str, Any] = {}
    for name, state in _stored(url, endpoint).items():
        assert name.endswith(".dcp") and state["shards"]["world_size"] == 2
        local = scratch / url.rsplit("/", 1)[1] / name
        fs.get(f"{url}/{name}/", str(local) + "/", recursive=True)
        dcp_to_torch_save(local, local.with_suffix(".pt"))
        out[name] = (state["step"], state["phase"],
                     torch.load(local.with_suffix(".pt"), weights_only=True))
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp_shards_in_the_bucket_two_nodes_killed_and_resumed_as_one_node(
        s3_endpoint: str, tmp_path: Path) -> None:
    """FSDP2 on two nodes, each rank writing its shards to the bucket in the background
    (DCP's fsspec writer) and the chief committing each checkpoint with its manifest:
    killed twice (node 0, then node 1) and resumed on both, the log, the firings and
    every kept checkpoint's full weights and optimizer state equal those of one node
    with two processes."""
    _bucket(s3_endpoint, "fsdp")
    ref = tmp_path / "one-node"
    spec = _spec(ref, "s3://fsdp/one-node", s3_endpoint)
    fsdp = spec.read_text().replace('task = "jobs.ddp:make_task"',
                                    'task = "jobs.ddp:make_momentum_task"\nstrategy = "fsdp"')
    spec.write_text(fsdp)
    one_node(spec, ref)
    two = tmp_path / "two-nodes"
    spec = _spec(two, "s3://fsdp/two-nodes", s3_endpoint)
    spec.write_text(fsdp.replace("s3://fsdp/one-node", "s3://fsdp/two-nodes"))
    for node, step in ((0, 10), (1, 15)):  # as TRIALS
        codes = finish(launch(spec, two, "--resume", "auto", kill=(node, step + 1)),
                       killed=node)
        assert codes[node] == -9 and codes[1 - node] != 0, codes
        assert _status(two) != "finished"  # killed while it trained
        assert step == 10 or _resumed(5), OUTPUTS[0][1][-2000:]
    assert finish(launch(spec, two, "--resume", "auto")) == [0, 0]
    assert _resumed(10), OUTPUTS[0][1][-2000:]
    assert _events(two / "node0" / "run") == _events(ref / "node0" / "run")
    assert_same_firings(ref, two)
    want = _full_states("s3://fsdp/one-node", s3_endpoint, tmp_path / "a")
    got = _full_states("s3://fsdp/two-nodes", s3_endpoint, tmp_path / "b")
    assert want and set(want) <= set(got), (list(want), list(got))  # as above
    for name in want:
        _same(want[name], got[name], name)


# -- a sharded checkpoint in a bucket, committed by its manifest ---------------------------


def _sharded(storage: Any, name: str, step: int, shards: dict[str, bytes]) -> Any:
    """``name``'s shard objects as DCP leaves them, committed by the chief."""
    from schedtrain.checkpoints.remote_shards import Remote, commit_remote

    remote = Remote(storage, name)
    for part, data in shards.items():
        storage.put(f"{name}/{part}", data)
    run = {"clock": {}, "table": {}, "callbacks": {}, "metrics": {}, "losses": {},
           "epoch_open": True, "written": []}  # the keys a reader needs (store.check_shape)
    commit_remote(remote, {"step": step, "epoch": 0, "phase": "step_end", "finite": True,
                           "run": run}, 2)
    return remote


def test_a_sharded_checkpoint_in_a_bucket_exists_once_its_manifest_is_written(
        s3_bucket: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """Shards without a manifest (a node died mid-write) are not a checkpoint: not
    listed, never resumed, removed whole by the next run; a committed one reads back
    with its shards' digests; deleting one removes every object of it."""
    from schedtrain.checkpoints.mount import Mount
    from schedtrain.checkpoints.remote_shards import listing, read_remote
    from schedtrain.checkpoints.storage import FsspecStorage

    url, options = s3_bucket
    storage = FsspecStorage(url + "/ck", options)
    done = _sharded(storage, "step-00000004.dcp", 4, {"__0_0.distcp": b"a" * 100,
                                                       "__1_0.distcp": b"b", ".metadata": b"m"})
    for part in ("__0_0.distcp", "__1_0.distcp", ".metadata"):  # a later save, cut short
        storage.put(f"step-00000008.dcp/{part}", b"partial")
    assert storage.committed() == ["step-00000004.dcp"]
    state = read_remote(done)
    assert state["step"] == 4 and set(state["shards"]["files"]) == {
        "__0_0.distcp", "__1_0.distcp", ".metadata"}
    mount = Mount(storage, tmp_path, chief=True)
    found = mount.newest_to_resume(tmp_path / "checkpoints")
    assert found is not None and found[0].name == "step-00000004.dcp"
    assert storage.clean_leftovers() == ["step-00000008.dcp"]
    assert listing(storage, "step-00000008.dcp") == {}
    storage.delete("step-00000004.dcp")
    assert listing(storage, "step-00000004.dcp") == {} and storage.committed() == []


@pytest.mark.parametrize("damage", ["changed", "missing", "added"])
def test_a_damaged_shard_in_a_bucket_is_passed_over_for_the_previous_checkpoint(
        s3_bucket: tuple[str, dict[str, Any]], tmp_path: Path, damage: str) -> None:
    """A shard changed or missing after the commit fails the checkpoint's read, naming
    the file; ``--resume auto`` passes over it to the previous one. An object added
    later is not the manifest's: ignored."""
    from schedtrain.checkpoints.mount import Mount
    from schedtrain.checkpoints.remote_shards import read_remote
    from schedtrain.checkpoints.storage import FsspecStorage

    url, options = s3_bucket
    storage = FsspecStorage(url + "/ck", options)
    _sharded(storage, "step-00000004.dcp", 4, {"__0_0.distcp": b"a", "__1_0.distcp": b"b"})
    newest = _sharded(storage, "step-00000008.dcp", 8,
                      {"__0_0.distcp": b"c", "__1_0.distcp": b"d"})
    if damage == "changed":
        storage.put("step-00000008.dcp/__1_0.distcp", b"e")
    elif damage == "missing":
        storage.remove("step-00000008.dcp/__1_0.distcp")
    else:
        storage.put("step-00000008.dcp/__2_0.distcp", b"f")
    skipped: list[str] = []
    found = Mount(storage, tmp_path, chief=True).newest_to_resume(
        tmp_path / "checkpoints", lambda p, why: skipped.append(why))
    assert found is not None
    if damage == "added":
        assert found[0].name == "step-00000008.dcp" and not skipped
        return
    assert found[0].name == "step-00000004.dcp"
    assert skipped and "'__1_0.distcp'" in skipped[0]
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp"):
        read_remote(newest)
