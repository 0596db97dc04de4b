"""``plan --import --nproc N`` (or ``WORLD_SIZE``) counts the steps per epoch of one of N
processes, divided as the run divides a plain ``DataLoader`` (a ``DistributedSampler``);
a spec for several processes counted for one says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from schedtrain.cli import main

_SPEC = """
[run]
task = "jobs.ddp:make_sized_task"
max_epochs = 1
grad_accum = {accum}
strategy = "{strategy}"
shard_data = {shard}

[callbacks.samples]
type = "jobs.ddp:DumpFirings"
trigger = {{ on = "train_end" }}
"""


def _spec(folder: Path, accum: int = 1, strategy: str = "ddp", shard: bool = True) -> Path:
    path = folder / "job.toml"
    path.write_text(_SPEC.format(accum=accum, strategy=strategy, shard=str(shard).lower()))
    return path


def _planned(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Steps per epoch of ``plan ARGS``'s first line, and its stderr."""
    capsys.readouterr()
    assert main(["plan", *args]) == 0
    out, err = capsys.readouterr()
    found = re.search(r"1 epochs? x ([\d,]+) steps", out)
    assert found is not None, out
    return int(found[1].replace(",", "")), err


def _taken(size: int, batch: int, drop: bool, ranks: int) -> list[int]:
    """Each rank's batches in an epoch: a DistributedSampler's loader, iterated."""
    data = list(range(size))
    return [len(list(DataLoader(data, batch_size=batch, drop_last=drop, sampler=(
        DistributedSampler(data, num_replicas=ranks, rank=r, drop_last=drop)))))
        for r in range(ranks)]


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(8, 300), batch=st.integers(1, 20), drop=st.booleans(),
       ranks=st.integers(1, 8), accum=st.integers(1, 3), env=st.booleans())
def test_a_ranks_steps_are_its_share_of_each_epoch(  # noqa: PLR0917
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        size: int, batch: int, drop: bool, ranks: int, accum: int, env: bool) -> None:
    """What every rank's loader takes, over ``grad_accum``: from --nproc, or from
    WORLD_SIZE (as under torchrun), which --nproc overrides."""
    monkeypatch.setenv("SIZED_TASK", f"{size},{batch},{int(drop)}")
    spec = _spec(tmp_path, accum)
    if env:
        monkeypatch.setenv("WORLD_SIZE", str(ranks))
        args = [str(spec), "--import"]
    else:
        monkeypatch.setenv("WORLD_SIZE", str(ranks + 1))
        args = [str(spec), "--import", "--nproc", str(ranks)]
    taken = _taken(size, batch, drop, ranks)
    assert len(set(taken)) == 1  # every rank the same
    assume(taken[0] > 0)  # an epoch of no step is no run's shape
    steps, err = _planned(capsys, *args)
    assert steps == -(-taken[0] // accum)
    assert "counted for one process" not in err


def test_unsharded_data_is_counted_whole_on_each_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SIZED_TASK", "250,10,0")
    steps, _ = _planned(capsys, str(_spec(tmp_path, shard=False)), "--import", "--nproc", "4")
    assert steps == 25


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_spec_for_several_processes_counted_for_one_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        strategy: str) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("SIZED_TASK", "250,10,0")
    spec = str(_spec(tmp_path, strategy=strategy))
    steps, err = _planned(capsys, spec, "--import")
    assert steps == 25
    [note] = [line for line in err.splitlines() if "counted for one process" in line]
    assert note.startswith("note: ") and "--nproc N" in note and "WORLD_SIZE" in note
    assert len(note) <= 300
    for command in (["check", spec, "--import"], ["diff", spec, spec, "--import"]):
        main(command)
        assert "counted for one process" in capsys.readouterr().err
    # a spec for one process (strategy "auto") is not flagged
    _planned(capsys, str(_spec(tmp_path, strategy="auto")), "--import")
    assert "counted for one process" not in capsys.readouterr().err


def test_check_and_diff_count_a_ranks_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """check compares the count with [clock] steps_per_epoch; diff simulates over it."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("SIZED_TASK", "250,10,0")
    spec = _spec(tmp_path)
    spec.write_text(spec.read_text() + "\n[clock]\nsteps_per_epoch = 13\n")
    capsys.readouterr()
    assert main(["check", str(spec), "--import", "--nproc", "2"]) == 0
    assert "steps_per_epoch" not in capsys.readouterr().err
    assert main(["check", str(spec), "--import"]) == 0
    assert "the task's data makes 25 steps per epoch" in capsys.readouterr().err
    other = tmp_path / "other.toml"
    other.write_text(spec.read_text().replace('on = "train_end"', 'every = "5 steps"'))
    main(["diff", str(spec), str(other), "--import", "--nproc", "2", "--format", "json"])
    out = capsys.readouterr().out
    assert '"step": 10' in out and '"step": 15' not in out  # 13 steps: 5 and 10


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--nproc", "0"], None, "--nproc: expected a whole number from 1 to 10,000, got 0"),
    (["--nproc", "two"], None, "--nproc: expected a whole number, got 'two'"),
    ([], "two", "WORLD_SIZE (environment): expected a number of processes from 1 to "
                "10,000, found 'two'; --nproc N overrides it"),
    ([], "0", "WORLD_SIZE (environment): expected a number of processes"),
    (["--no-import"], None, "--nproc divides the steps per epoch counted from the [run] "
                            "task: give --import"),
])
def test_a_bad_process_count_is_one_clear_line(  # noqa: PLR0917
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: list[str], env: str | None, message: str) -> None:
    monkeypatch.setenv("SIZED_TASK", "250,10,0")
    if env is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", env)
    spec = str(_spec(tmp_path))
    argv = (["plan", spec, "--nproc", "2"] if args == ["--no-import"]
            else ["plan", spec, "--import", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert all(len(line) <= 300 for line in err.splitlines())
