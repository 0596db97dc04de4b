"""Two real processes (torchrun, gloo on the CPU): every decision agreed across ranks."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from torchrun_helpers import forked_ranks, torchrun

from schedtrain import Schedule, every, on
from schedtrain.testing import fired_at, simulate

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

# no_fsync: the ranks forked from this process save every few steps (tests/conftest.py).
pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(),
                                 reason="torch.distributed is not available"),
              pytest.mark.usefixtures("no_fsync")]

BASE = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = {epochs}
seed = 1

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "1 epoch" }}

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

[callbacks.best]
type = "MinSaver"
trigger = {{ all = [{{ every = "1 epoch" }}, {{ improved = "val/loss" }}] }}

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = {{ any = [{{ every = "100 samples" }}, {{ on = "train_end" }}] }}
"""


def write_spec(folder: Path, extra: str = "", epochs: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "ddp.toml"
    spec.write_text(BASE.format(epochs=epochs) + extra)
    return spec




def events(run_dir: Path) -> list[dict[str, object]]:
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")} for r in rows]


def rank_firings(folder: Path, rank: int) -> list[list[object]]:
    data: list[list[object]] = json.loads((folder / f"firings-rank{rank}.json").read_text())
    return data


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ddp")
    spec = write_spec(folder)
    result = forked_ranks(spec, folder / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return spec, folder / "run"


def test_both_ranks_fire_identically_and_one_log_is_written(
        reference: tuple[Path, Path]) -> None:
    """The same firings on both ranks (metric conditions on values that differ per rank
    included), and one events.jsonl without a duplicated line."""
    _, run_dir = reference
    zero, one = rank_firings(run_dir.parent, 0), rank_firings(run_dir.parent, 1)
    assert zero == one and zero
    rows = events(run_dir)
    firing_rows = [[r["callback"], r["event"], r["step"], r["sample"]] for r in rows
                   if r["kind"] == "firing"]
    assert firing_rows == zero
    assert len({json.dumps(r) for r in firing_rows}) == len(firing_rows)  # none twice
    # rank/value is 0 on rank 0 and 1 on rank 1: every rank sees the mean, 0.5
    values = {r["value"] for r in rows if r.get("name") == "rank/value"}
    assert values == {0.5}
    # "high" needs rank/value > 0.4: the mean passes on both ranks (rank 0's own 0 would not)
    assert any(f[0] == "high" for f in zero)


def test_samples_are_global(reference: tuple[Path, Path]) -> None:
    """`every 100 samples` counts both ranks' samples: 2 x 16 per step, as simulated with
    the global batch."""
    _, run_dir = reference
    got = [f[2] for f in rank_firings(run_dir.parent, 0)
           if f[0] == "samples" and f[1] == "step_end"]
    log = simulate(Schedule({"samples": every("100 samples") | on("train_end")}), epochs=3,
                   steps_per_epoch=8, samples_per_batch=32)
    assert got == [s for s in fired_at(log, "samples") if s < 24]
    assert all(f[3] == f[2] * 32 for f in rank_firings(run_dir.parent, 0))


def test_counters_are_global_at_epoch_ends_after_steps_where_nothing_could_fire(
        tmp_path: Path) -> None:
    """An epoch's last step that is a check step (16) with nothing due there is recorded
    with the last agreed counters; the epoch's end agrees again and corrects them."""
    spec = tmp_path / "ends.toml"
    spec.write_text("""\
[run]
task = "jobs.ddp:make_task"
max_epochs = 3
seed = 1

[callbacks.tick]
type = "jobs.ddp:RankMetric"
trigger = { every = "5 steps" }

[callbacks.ends]
type = "jobs.ddp:DumpFirings"
trigger = { any = [{ every = "1 epoch" }, { on = "train_end" }] }
""")
    result = forked_ranks(spec, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    firings = rank_firings(tmp_path, 0)
    assert [f[2] for f in firings if f[0] == "ends" and f[1] == "epoch_end"] == [8, 16, 24]
    assert all(f[3] == f[2] * 32 for f in firings), firings  # 2 ranks x 16 samples a step
    rows = [r for r in events(tmp_path / "run") if r["kind"] == "firing"]
    assert all(r["sample"] == r["step"] * 32 for r in rows), rows


def test_a_stop_on_one_rank_stops_both_at_the_same_step(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, """
[callbacks.stop]
type = "jobs.ddp:StopOnRank"
rank = 1
step = 6
trigger = { every = "2 steps" }
""")
    result = forked_ranks(spec, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    zero, one = rank_firings(tmp_path, 0), rank_firings(tmp_path, 1)
    assert zero == one
    assert max(int(f[2]) for f in zero) == 6  # type: ignore[call-overload]
    assert "rank 1 asked at step 6 (on rank 1)" in result.stdout
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 6)


def test_an_exception_on_one_rank_ends_both_quickly(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, """
[callbacks.fail]
type = "jobs.ddp:FailOnRank"
rank = 1
step = 5
trigger = { every = "1 step" }
""", epochs=50)
    start = time.monotonic()
    result = torchrun(spec, tmp_path / "run", timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 45
    assert ("error on rank 1: callback 'fail' at step_end (step 5, epoch 0) raised "
            "RuntimeError: deliberate failure on rank 1") in result.stderr


SLOW = """
[callbacks.slow]
type = "jobs.ddp:Sleep"
seconds = 0.05
trigger = { every = "1 step" }
"""


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ddp-slow")
    spec = write_spec(folder, SLOW)
    result = forked_ranks(spec, folder / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return spec, folder / "run"


def _same_run(ref: Path, run_dir: Path) -> None:
    assert events(run_dir) == events(ref)
    for kept in sorted(ref.rglob("*.pt")):
        a = torch.load(kept, weights_only=True)["model"]
        b = torch.load(run_dir / kept.relative_to(ref), weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), kept.name
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]


def test_kill_9_of_a_two_rank_run_resumes_exactly(slow_reference: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    """Launcher and ranks killed twice mid-training, resumed with --resume auto: the same
    log and bit-identical checkpoints as the uninterrupted two-rank run."""
    spec, ref = slow_reference
    run_dir = tmp_path / "run"
    for line in (20, 55):
        killed = torchrun(spec, run_dir, "--resume", "auto", kill_at_line=line)
        assert killed.returncode != 0
    result = forked_ranks(spec, run_dir, "--resume", "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    _same_run(ref, run_dir)


def test_sigterm_preempts_both_ranks_at_one_step_then_resumes_exactly(
        slow_reference: tuple[Path, Path], tmp_path: Path) -> None:
    """SIGTERM to the job: both ranks stop at one agreed step and the chief writes one
    preemption checkpoint (torchrun itself exits 1 on SIGTERM, whatever its ranks do);
    resumed, the run equals the uninterrupted one."""
    spec, ref = slow_reference
    run_dir = tmp_path / "run"
    first = torchrun(spec, run_dir, kill_at_line=20, sig=signal.SIGTERM)
    assert first.returncode != 0
    assert first.stderr.count("preempted by SIGTERM") == 1, first.stderr[-3000:]
    status = json.loads((run_dir / "run.json").read_text())
    assert status["status"] == "preempted"
    preempted = [p for p in (run_dir / "checkpoints").glob("*.pt")
                 if torch.load(p, weights_only=True)["phase"] == "preempt"]
    assert len(preempted) == 1
    result = forked_ranks(spec, run_dir, "--resume", "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    _same_run(ref, run_dir)


FSDP = """
[callbacks.weights]
type = "jobs.ddp:DumpWeights"
trigger = { on = "epoch_start" }
"""


def fsdp_spec(folder: Path, extra: str = "", epochs: int = 3) -> Path:
    """The job sharded with FSDP2, with momentum (optimizer state to checkpoint)."""
    spec = write_spec(folder, FSDP + extra, epochs=epochs)
    spec.write_text(spec.read_text().replace(
        'task = "jobs.ddp:make_task"', 'task = "jobs.ddp:make_momentum_task"\nstrategy = "fsdp"'))
    return spec


def full_state(checkpoint: Path, scratch: Path) -> dict[str, object]:
    """A sharded checkpoint's model and optimizer states as full tensors, read with
    plain PyTorch as docs/checkpoints.md says."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / f"{checkpoint.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    state: dict[str, object] = torch.load(out, weights_only=True)
    return state


def assert_same_tensors(a: object, b: object, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            assert_same_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fsdp")
    spec = fsdp_spec(folder, SLOW)
    result = forked_ranks(spec, folder / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return spec, folder / "run"


def test_fsdp_writes_sharded_checkpoint_directories(fsdp_reference: tuple[Path, Path],
                                                    tmp_path: Path) -> None:
    """Every rank's shard is in each directory; ModelSaver kept 2 of them; the best one
    is a directory too; each loads in plain PyTorch with its run state beside it."""
    from schedtrain.checkpoints import read_checkpoint

    _, run_dir = fsdp_reference
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["step-00000020.dcp", "step-00000024.dcp"]
    assert [p.name for p in (run_dir / "best").iterdir()] == ["min-val-loss.dcp"]
    last = run_dir / "checkpoints" / kept[-1]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "run.pt"} <= {
        p.name for p in last.iterdir()}
    state = read_checkpoint(last)
    assert (state["step"], state["phase"], state["shards"]["world_size"]) == (
        24, "train_end", 2)
    assert set(full_state(last, tmp_path)["model"]) == {  # type: ignore[arg-type]
        "0.weight", "0.bias", "2.weight", "2.bias"}
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]


def test_fsdp_kill_9_resumes_exactly(fsdp_reference: tuple[Path, Path],
                                     tmp_path: Path) -> None:
    """Killed twice mid-training and resumed with --resume auto on 2 ranks: the same log,
    and the same weights and optimizer state in every kept checkpoint, as the
    uninterrupted run."""
    spec, ref = fsdp_reference
    run_dir = tmp_path / "run"
    for line in (20, 55):
        killed = torchrun(spec, run_dir, "--resume", "auto", kill_at_line=line)
        assert killed.returncode != 0
    result = forked_ranks(spec, run_dir, "--resume", "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    assert events(run_dir) == events(ref)
    kept = sorted(p.relative_to(ref) for p in ref.rglob("*.dcp"))
    assert kept == sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.dcp"))
    for rel in kept:
        assert_same_tensors(full_state(ref / rel, tmp_path / "a"),
                            full_state(run_dir / rel, tmp_path / "b"), str(rel))
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]


def test_fsdp_sigterm_writes_one_sharded_checkpoint_then_resumes_exactly(
        fsdp_reference: tuple[Path, Path], tmp_path: Path) -> None:
    """SIGTERM under FSDP2: every rank writes its shard of one preemption checkpoint
    directory; resumed, the log and the kept checkpoints equal the uninterrupted run's."""
    spec, ref = fsdp_reference
    run_dir = tmp_path / "run"
    first = torchrun(spec, run_dir, kill_at_line=20, sig=signal.SIGTERM)
    assert first.returncode != 0
    assert first.stderr.count("preempted by SIGTERM") == 1, first.stderr[-3000:]
    from schedtrain.checkpoints import read_checkpoint

    preempted = [p for p in (run_dir / "checkpoints").iterdir()
                 if read_checkpoint(p)["phase"] == "preempt"]
    assert len(preempted) == 1 and preempted[0].suffix == ".dcp"
    assert str(preempted[0]) in first.stderr
    result = forked_ranks(spec, run_dir, "--resume", "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    assert events(run_dir) == events(ref)
    for rel in sorted(p.relative_to(ref) for p in ref.rglob("*.dcp")):
        assert_same_tensors(full_state(ref / rel, tmp_path / "a"),
                            full_state(run_dir / rel, tmp_path / "b"), str(rel))


def test_fsdp_async_saves_equal_sync_ones(fsdp_reference: tuple[Path, Path],
                                          tmp_path: Path) -> None:
    """The FSDP2 run with background saves (the default: each rank stages its shards and
    DCP writes them) and with ``checkpoint_mode = "sync"``: the same log, the same kept
    checkpoints with byte-identical shard files, the same tensors and run state in each."""
    from schedtrain.checkpoints import read_checkpoint

    _, ref = fsdp_reference
    spec = fsdp_spec(tmp_path / "spec", SLOW)
    spec.write_text(spec.read_text().replace("seed = 1", 'seed = 1\ncheckpoint_mode = "sync"'))
    result = forked_ranks(spec, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert events(run_dir) == events(ref)
    kept = sorted(p.relative_to(ref) for p in ref.rglob("*.dcp"))
    assert kept == sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.dcp"))
    for rel in kept:  # (.metadata names the folder it was written in: not compared)
        shards = sorted(p.name for p in (ref / rel).glob("*.distcp"))
        assert shards == sorted(p.name for p in (run_dir / rel).glob("*.distcp"))
        for name in shards:
            assert (ref / rel / name).read_bytes() == (run_dir / rel / name).read_bytes()
        assert_same_tensors(full_state(ref / rel, tmp_path / "a"),
                            full_state(run_dir / rel, tmp_path / "b"), str(rel))
        a, b = read_checkpoint(ref / rel), read_checkpoint(run_dir / rel)
        a["shards"]["files"].pop(".metadata")
        b["shards"]["files"].pop(".metadata")
        assert (a["step"], a["phase"], a["shards"]) == (b["step"], b["phase"], b["shards"])
        assert a["run"]["written"] == b["run"]["written"]


def test_fsdp_save_in_flight_is_committed_when_the_chief_fails(tmp_path: Path) -> None:
    """The step-5 save is still being written in the background when the chief raises at
    step 7: the chief finishes and commits it before exiting (no collective on that way
    out: the other rank need not be there), and it resumes."""
    from schedtrain.checkpoints import read_checkpoint

    spec = fsdp_spec(tmp_path, SLOW + """
[callbacks.fail]
type = "jobs.ddp:FailOnRank"
rank = 0
step = 7
trigger = { every = "1 step" }
""")
    result = torchrun(spec, tmp_path / "run", timeout=60)
    assert result.returncode != 0
    assert "deliberate failure on rank 0" in result.stderr
    folder = tmp_path / "run" / "checkpoints"
    assert [p.name for p in folder.iterdir()] == ["step-00000005.dcp"]
    state = read_checkpoint(folder / "step-00000005.dcp")
    assert (state["step"], state["shards"]["world_size"]) == (5, 2)
    assert set(full_state(folder / "step-00000005.dcp", tmp_path / "full")["model"]
               ) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # type: ignore[arg-type]


def test_fsdp_busy_skip_is_decided_alike_on_every_rank(tmp_path: Path) -> None:
    """A save every step with ``checkpoint_busy = "skip"``: whether the previous shards
    are still being written differs between ranks, yet they skip together (a rank alone
    would hang the next collective), and every directory committed is complete."""
    from schedtrain.checkpoints import read_checkpoint

    spec = fsdp_spec(tmp_path, epochs=1)  # 8 steps
    spec.write_text(spec.read_text().replace("seed = 1", 'seed = 1\ncheckpoint_busy = "skip"')
                    .replace('every = "5 steps"', 'every = "1 step"')
                    .replace("keep = 2", "keep = 100")
                    .replace("make_momentum_task", "make_slow_save_task"))
    result = forked_ranks(spec, tmp_path / "run", timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert kept and all(p.suffix == ".dcp" for p in kept)
    assert len(kept) < 8  # saves asked for while one was being written were skipped
    for path in kept:  # checks run.pt and every shard against its digest
        assert read_checkpoint(path)["shards"]["world_size"] == 2
    assert not [p for p in (tmp_path / "run").rglob("*") if ".tmp" in p.name]


@pytest.fixture(scope="module")
def fsdp_two_epochs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-epoch run on 2 ranks (its last checkpoint is at train_end)."""
    folder = tmp_path_factory.mktemp("fsdp-2")
    result = forked_ranks(fsdp_spec(folder, epochs=2), folder / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "run"


@pytest.mark.parametrize(("ranks", "resume"), [(1, "PATH"), (3, "auto")])
def test_fsdp_checkpoint_resumes_on_another_number_of_ranks(
        fsdp_two_epochs: Path, tmp_path: Path, ranks: int, resume: str) -> None:
    """A 2-rank epoch-end checkpoint continues on 1 process (full tensors) or 3 ranks
    (resharded): the weights and optimizer state at the next epoch's start are the
    checkpoint's, and the third epoch has as many steps as that many ranks give."""
    run_dir = tmp_path / "run"
    shutil.copytree(fsdp_two_epochs, run_dir)
    checkpoint = run_dir / "checkpoints" / "step-00000016.dcp"
    spec = fsdp_spec(tmp_path / "spec", epochs=3)
    result = forked_ranks(spec, run_dir, "--resume",
                      str(checkpoint) if resume == "PATH" else "auto", nproc=ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    dumped = torch.load(tmp_path / f"weights-{ranks}.pt", weights_only=True)
    saved = full_state(fsdp_two_epochs / checkpoint.relative_to(run_dir), tmp_path)
    assert_same_tensors(saved["model"], dumped["model"], "model")
    assert_same_tensors(saved["optimizer"]["state"],  # type: ignore[index]
                        dumped["optimizer"]["state"], "optimizer")
    per_rank = -(-256 // ranks)  # DistributedSampler pads to an even split
    status = json.loads((run_dir / "run.json").read_text())
    assert (status["status"], status["epoch"]) == ("finished", 3)
    assert status["step"] == 16 + -(-per_rank // 16)
    firings = [json.dumps(r) for r in events(run_dir) if r["kind"] == "firing"]
    assert len(set(firings)) == len(firings)


def test_a_one_process_checkpoint_resumes_sharded_on_two_ranks(tmp_path: Path) -> None:
    """A one-file checkpoint (full tensors, optimizer state by index) from one process
    continues under FSDP2 on 2 ranks: the gathered weights and optimizer state at the next
    epoch's start are the file's."""
    spec = fsdp_spec(tmp_path / "first", epochs=2)
    first = forked_ranks(spec, tmp_path / "run", nproc=1)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000032.pt"
    saved = torch.load(checkpoint, weights_only=True)
    result = forked_ranks(fsdp_spec(tmp_path / "spec", epochs=3), tmp_path / "run", "--resume",
                      "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    dumped = torch.load(tmp_path / "weights-2.pt", weights_only=True)
    assert_same_tensors(saved["model"], dumped["model"], "model")
    names = list(saved["model"])  # parameters in the optimizer's order (all weights here)
    assert_same_tensors({names[i]: v for i, v in saved["optimizer"]["state"].items()},
                        dumped["optimizer"]["state"], "optimizer")
    assert list((tmp_path / "run" / "checkpoints").glob("*.dcp"))


@pytest.mark.slow
def test_the_digits_spec_on_two_ranks_stops_on_a_training_metric(tmp_path: Path) -> None:
    """specs/digits_ddp.toml with EarlyStopping on train/loss (each rank's loss, reduced):
    both ranks stop at one epoch's end, one log without a repeated line, a good model."""
    pytest.importorskip("sklearn")
    spec = tmp_path / "digits_ddp.toml"
    spec.write_text((ROOT / "specs" / "digits_ddp.toml").read_text() + """
[callbacks.stop_train]
type = "EarlyStopping"
monitor = "train/loss"
patience = 2
min_delta = 0.02
trigger = { every = "1 epoch" }
""")
    result = forked_ranks(spec, tmp_path / "run", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "stopped" and status["epoch"] < 20
    from examples.digits import make_task

    loader = make_task().train_data
    per_rank = -(-len(loader.dataset) // 2)  # type: ignore[attr-defined]
    assert status["step"] == status["epoch"] * -(-per_rank // loader.batch_size)  # type: ignore[attr-defined]
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    assert len(set(lines)) == len(lines)
    stops = [r for r in events(tmp_path / "run")
             if r["kind"] == "firing" and r["callback"] == "stop_train"]
    assert stops[-1]["step"] == status["step"]
    accuracy = [r["value"] for r in events(tmp_path / "run") if r.get("name") == "val/accuracy"]
    assert accuracy[-1] > 0.9  # type: ignore[operator]
    assert "stopped by stop_train" in result.stdout


@pytest.mark.parametrize(("run", "path", "expected"), [
    ('strategy = "dp"', "run.strategy", "'auto', 'ddp' or 'fsdp'"),
    ('reduce = { "val/loss" = "median" }', "run.reduce.val/loss", "'mean', 'sum', 'max' or 'min'"),
    ("shard_data = 1", "run.shard_data", "true or false"),
])
def test_bad_run_settings_for_several_processes_are_named(tmp_path: Path, run: str,
                                                          path: str, expected: str) -> None:
    from schedtrain.errors import SpecError
    from schedtrain.spec import load_spec

    spec = tmp_path / "s.toml"
    spec.write_text(f'[run]\n{run}\n[callbacks.a]\ntrigger = {{ every = "1 epoch" }}\n')
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    (problem,) = info.value.problems
    assert problem.path == path and expected in str(problem)
