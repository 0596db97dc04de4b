"""``check`` and ``plan`` of a schedule meant for a host (no ``[run]``, or ``--host``):
no warning that the host's metrics are never produced, no line on how schedtrain writes
checkpoints when it writes none; a metric trigger without a clock part gets a note
suggesting a gate, whoever runs it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from schedtrain.cli.main import main

RUN = """
[run]
task = "nowhere:make_task"
max_epochs = 2
"""
CLOCK = """
[clock]
epochs = 2
steps_per_epoch = 10
"""
# persona 1's schedule: every metric comes from the LightningModule's self.log
HOST_SCHEDULE = """
[callbacks.validate]
trigger = { every = "5 steps" }

[callbacks.stop]
type = "EarlyStopping"
monitor = "val/loss"
patience = 3
trigger = { all = [{ every = "5 steps" }, { improved = "val/acc", mode = "max" }] }
"""

#: A host verb's saves, kept by schedtrain's retention.
HOST_SAVE = """
[callbacks.ckpt]
keep = 2
trigger = { every = "5 steps" }
"""
MODEL_SAVER = """
[callbacks.ckpt]
type = "ModelSaver"
trigger = { every = "5 steps" }
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


class TestHostMetrics:
    """The host produces the metrics: reading one is neither a problem nor a warning."""

    @pytest.mark.parametrize("do_import", [False, True])
    @pytest.mark.parametrize(("head", "flags"), [
        ("", []), (RUN, ["--host", "lightning"]), (RUN, ["--host", "transformers"]),
        ("", ["--host", "ignite"])])
    def test_no_metric_warning(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               head: str, flags: list[str], do_import: bool) -> None:
        path = write(tmp_path, head + HOST_SCHEDULE)
        argv = ["check", path, *flags, *(["--import"] if do_import else [])]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "never produced" not in err and "warning" not in err

    def test_own_trainer_still_checked(self, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
        """With ``[run]`` and no ``--host`` the trainer's metrics are checked as before."""
        path = write(tmp_path, RUN + HOST_SCHEDULE.partition("[callbacks.stop]")[1]
                     + HOST_SCHEDULE.partition("[callbacks.stop]")[2])
        assert main(["check", path]) == 2
        assert "metric 'val/loss' is never produced" in capsys.readouterr().err

    def test_typed_callbacks_still_checked(self, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        """A host's typed callback with a bad argument is still refused."""
        path = write(tmp_path, HOST_SCHEDULE.replace("patience = 3", "patience = 0"))
        assert main(["check", path, "--import"]) == 2
        assert "callbacks.stop" in capsys.readouterr().err

    def test_unknown_host_is_a_usage_error(self, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        path = write(tmp_path, HOST_SCHEDULE)
        assert main(["check", path, "--host", "keras"]) == 2
        assert "argument --host: invalid choice: 'keras'" in capsys.readouterr().err


class TestHostPlan:
    """``plan`` of a host's schedule has no ``saves:`` line (the host writes its own)."""

    @pytest.mark.parametrize("saver", ["", HOST_SAVE, MODEL_SAVER])
    @pytest.mark.parametrize(("head", "flags"), [
        ("", []), (RUN, ["--host", "lightning"]), (RUN, ["--host", "transformers"]),
        ("", ["--host", "ignite"]), (RUN, [])])
    def test_saves_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str,
                        flags: list[str], saver: str) -> None:
        """The line is there exactly when schedtrain's own saver writes the files: not
        for a host verb's saves, nor for a schedule without a saver."""
        path = write(tmp_path, head + CLOCK + HOST_SCHEDULE + saver)
        assert main(["plan", path, *flags]) == 0
        out = capsys.readouterr().out
        shown = saver == MODEL_SAVER
        assert any(line.startswith("saves:") for line in out.splitlines()) == shown

    @pytest.mark.parametrize(("flags", "first", "then"), [
        (["--host", "lightning"], "ckpt-epoch=0-step=5.ckpt",
         "ckpt-epoch=1-step=15.ckpt, ckpt-epoch=1-step=20.ckpt"),
        (["--host", "transformers"], "checkpoint-5", "checkpoint-15, checkpoint-20"),
        (["--host", "ignite"], "ckpt-step=5", "ckpt-step=15, ckpt-step=20"),
        ([], "ckpt-step=5", "ckpt-step=15, ckpt-step=20")])
    def test_host_file_names(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             flags: list[str], first: str, then: str) -> None:
        """A host verb's files are listed under the names that host gives them (as
        ``planned_files`` with ``SaverFiles(host)`` names them); a host that names none
        of its own, or none given, by the verb's step."""
        path = write(tmp_path, CLOCK + HOST_SCHEDULE + HOST_SAVE)
        assert main(["plan", path, *flags]) == 0
        out = capsys.readouterr().out
        assert f"after ckpt at step 5: {first}\n" in out
        assert f"after ckpt at step 20: {then}\n" in out

    def test_a_saver_keeps_it(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A spec without ``[run]`` that declares a schedtrain saver still says how it saves."""
        path = write(tmp_path, CLOCK + """
            [callbacks.save]
            type = "ModelSaver"
            trigger = { every = "5 steps" }
        """)
        assert main(["plan", path]) == 0
        assert "saves: checkpoint_mode" in capsys.readouterr().out


class TestGateNote:
    """D14: a metric trigger (``plateau``, ``improved``) with no clock part is evaluated at
    every event: ``check`` suggests a gate, naming the key path."""

    @pytest.mark.parametrize(("trigger", "noted"), [
        ('{ plateau = "val/loss", patience = 3 }', True),
        ('{ improved = "val/loss" }', True),
        ('{ any = [{ improved = "val/loss" }, { every = "2 steps" }] }', True),
        ('{ not = { improved = "val/loss" } }', True),
        ('{ all = [{ every = "1 epoch" }, { plateau = "val/loss", patience = 3 }] }', False),
        ('{ every = "1 epoch", if = "val/loss < 3" }', False),
        ('{ every = "2 steps" }', False),
    ])
    @pytest.mark.parametrize("head", ["", RUN])
    def test_note(self, tmp_path: Path, capsys: pytest.CaptureFixture[str], trigger: str,
                  noted: bool, head: str) -> None:
        path = write(tmp_path, head + f"""
            [callbacks.stop]
            trigger = {trigger}
        """)
        main(["check", path, "--host", "lightning"] if head else ["check", path])
        err = capsys.readouterr().err
        said = "callbacks.stop.trigger: " in err and "has no clock part" in err
        assert said == noted, err
        if noted:
            assert 'gate it where \'val/loss\' is new: trigger = { all = [{ every = "1 epoch" }' \
                in err
