"""``schedtrain diff RUN_DIR NEW`` shows what ``--resume auto`` would change (issue 34
item 13): from the run's checkpoint step, with ``--import`` for a spec with ``[run]`` and
no ``[clock]``, and a checkpoint by URL (read with the spec's ``storage_options``)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from schedtrain.cli import main
from schedtrain.planning.changes import canonical
from schedtrain.spec import loads_spec

OLD = ('[clock]\nepochs = 4\nsteps_per_epoch = 10\n[callbacks.ckpt]\ntype = "ModelSaver"\n'
       'trigger = {{ every = "{every} steps" }}\n')


def _diff(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["diff", *argv])
    return code, out.getvalue(), err.getvalue()


def _schedule(every: int) -> str:
    text = canonical(loads_spec(OLD.format(every=every)).schedule())
    assert text is not None
    return text


@pytest.mark.parametrize("step", [6, 22, 35])
def test_a_run_directory_compares_from_its_checkpoint_step(tmp_path: Path, step: int) -> None:
    """A run directory whose checkpoints are elsewhere (a bucket): run.json names the
    checkpoint; the firings compared are those after its step, none already trained."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "schedule": _schedule(20), "step": step + 3, "status": "preempted",
        "checkpoint": str(tmp_path / "elsewhere" / f"step-{step:08d}.pt")}))
    new = tmp_path / "new.toml"
    new.write_text(OLD.format(every=30))
    code, out, _ = _diff(str(run), str(new), "--format", "json")
    assert code == 1
    firings = json.loads(out)["firings"]
    assert firings["from_step"] == step
    assert firings["changes"]
    assert all(c[side]["step"] > step for c in firings["changes"]
               for side in ("old", "new") if c.get(side))


def test_import_counts_the_steps_of_a_spec_without_clock(tmp_path: Path) -> None:
    """A spec with [run] and no [clock]: with --import the firings are compared (the
    steps per epoch counted from the task, as plan --import does); without, a note."""
    run = ('[run]\ntask = "examples.digits:make_task"\nmax_epochs = 2\nseed = 0\n'
           '[callbacks.ckpt]\ntype = "ModelSaver"\ntrigger = {{ every = "{every} steps" }}\n')
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(run.format(every=20))
    new.write_text(run.format(every=30))
    code, _, err = _diff(str(old), str(new))
    assert code == 1 and "firings not compared" in err
    code, out, err = _diff(str(old), str(new), "--import", "--format", "json")
    assert code == 1 and "firings not compared" not in err, err
    steps = {c[side]["step"] for c in json.loads(out)["firings"]["changes"]
             for side in ("old", "new") if c.get(side)}
    assert steps == {20, 40, 80, 30, 90}  # 2 epochs of 45 steps; 60 stays


def _put_checkpoint(url: str, options: dict[str, Any], step: int, schedule: str) -> None:
    import torch

    from schedtrain.checkpoints.storage import open_storage
    from schedtrain.checkpoints.store import checkpoint_body

    name = f"step-{step:08d}.pt"
    body = checkpoint_body({"step": step, "run": {"schedule": schedule, "epoch_open": True}},
                           name)
    open_storage(url, options).write(name, lambda f: torch.save(body, f))


def test_a_checkpoint_url_is_read_with_the_specs_storage_options(
        s3_bucket: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """diff s3://.../step-N.pt NEW: read with NEW's storage_options; the firings after
    step N compared. A checkpoint folder URL takes its newest checkpoint."""
    bucket, options = s3_bucket
    folder = f"{bucket}/run/checkpoints"
    _put_checkpoint(folder, options, 10, _schedule(20))
    _put_checkpoint(folder, options, 25, _schedule(20))
    endpoint = options["client_kwargs"]["endpoint_url"]
    new = tmp_path / "new.toml"
    new.write_text(OLD.format(every=30) + (
        '[run]\ntask = "m:f"\ncheckpoint_dir = "' + folder + '"\n'
        '[run.storage_options.client_kwargs]\nendpoint_url = "' + endpoint + '"\n'))
    for url, step in ((f"{folder}/step-{10:08d}.pt", 10), (folder, 25)):
        code, out, err = _diff(url, str(new), "--format", "json")
        assert code == 1, err
        assert json.loads(out)["firings"]["from_step"] == step
    code, _, err = _diff(f"{folder}/step-{99:08d}.pt", str(new))
    assert code == 2 and "step-00000099.pt" in err and "Traceback" not in err
