"""A mode that counts a metric the wrong way is warned about: against the callback it
gates (a MaxSaver keeps the highest) or against the metric's name (accuracy rises)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.cli import main
from schedtrain.spec import loads_spec
from schedtrain.spec.direction import HIGHER_IS_BETTER, LOWER_IS_BETTER, metric_direction

UP = ["val/accuracy", "val/acc", "test/f1", "val/auc", "val/map", "val/acc1", "bleu"]
DOWN = ["val/loss", "train/loss", "val/error", "val-error-top1", "val/perplexity", "mse"]
NEUTRAL = ["my/score", "weights/norm", "val/top1", "lr"]


@given(st.sampled_from(["", "val/", "train_", "eval-"]),
       st.sampled_from(sorted(LOWER_IS_BETTER | HIGHER_IS_BETTER)),
       st.sampled_from(["", "_top5", "/mean", "1", "@3"]))
def test_direction_from_the_name(prefix: str, word: str, suffix: str) -> None:
    """A name holding a word of one list (whatever around it) has that list's direction;
    one holding words of both, none."""
    if word[-1].isdigit() and suffix == "1":
        suffix = "_1"  # 'f11' is not 'f1'
    name = f"{prefix}{word}{suffix}"
    expected = "min" if word in LOWER_IS_BETTER else "max"
    assert metric_direction(name) == expected
    other = "accuracy" if expected == "min" else "loss"
    assert metric_direction(f"{name}/{other}") is None


@pytest.mark.parametrize("name", NEUTRAL)
def test_names_that_say_nothing(name: str) -> None:
    """Names without a telling word have no direction: nothing is warned about them."""
    assert metric_direction(name) is None


KEEPERS = {"MinSaver": "min", "MaxSaver": "max", "TopKSaver": None, "EarlyStopping": None}


def _spec(kind: str, monitor: str, mode: str | None, gate: str | None,
          gate_mode: str | None) -> str:
    args = f'monitor = "{monitor}"\n' + (f'mode = "{mode}"\n' if mode else "")
    extra = "patience = 2\n" if kind == "EarlyStopping" and gate is None else ""
    gmode = f', mode = "{gate_mode}"' if gate_mode else ""
    part = (f'{{ {gate} = "{monitor}"{gmode}' + (", patience = 2 }" if gate == "plateau"
                                                  else " }")) if gate else None
    trigger = (f'{{ all = [{{ every = "1 epoch" }}, {part}] }}' if part
               else '{ every = "1 epoch" }')
    return textwrap.dedent(f"""
        [callbacks.validate]
        type = "InferenceRunner"
        trigger = {{ every = "1 epoch" }}
        [callbacks.keep]
        type = "{kind}"
        """) + args + extra + f"trigger = {trigger}\n"


@given(st.sampled_from(sorted(KEEPERS)), st.sampled_from(UP + DOWN + NEUTRAL),
       st.sampled_from([None, "min", "max"]), st.sampled_from([None, "improved", "plateau"]),
       st.sampled_from([None, "min", "max"]))
def test_warned_where_modes_disagree(kind: str, monitor: str, mode: str | None,
                                     gate: str | None, gate_mode: str | None) -> None:
    """The monitor is warned about iff its name's direction differs from the callback's;
    the gating trigger iff its mode differs from the callback's or the name's."""
    if KEEPERS[kind] is not None and mode is not None:
        mode = None  # Min/MaxSaver take no mode
    spec = loads_spec(_spec(kind, monitor, mode, gate, gate_mode))
    warned = {w.partition(": ")[0] for w in spec.warnings}
    keeps = KEEPERS[kind] or mode or "min"
    said = metric_direction(monitor)
    assert ("callbacks.keep.monitor" in warned) == (said is not None and said != keeps)
    gate_path = f"callbacks.keep.trigger.all[1].{gate}"
    counted = gate_mode or "min"
    assert (gate_path in warned) == (gate is not None and (
        counted != keeps or (said is not None and said != counted)))
    assert not {w for w in warned if w.startswith("callbacks.validate")}


@pytest.mark.parametrize(("gate", "metric"), [("improved", "val/accuracy"),
                                              ("plateau", "val/f1"), ("improved", "val/loss")])
def test_ungated_trigger_follows_the_name(gate: str, metric: str) -> None:
    """A metric trigger gating a callback that keeps no best is judged by the name."""
    extra = ", patience = 2" if gate == "plateau" else ""
    spec = loads_spec(f'[callbacks.log]\ntype = "ModelSaver"\ntrigger = {{ {gate} = '
                      f'"{metric}"{extra} }}\n')
    path = f"callbacks.log.trigger.{gate}"
    warned = [w for w in spec.warnings if w.startswith(path + ":")]
    assert bool(warned) == (metric_direction(metric) == "max")
    if warned:
        assert 'give mode = "max"' in warned[0]


def test_check_and_train_print_each_warning_once(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``check`` warns and exits 0; ``train`` prints the same warning lines, each once."""
    name = f"dir_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from schedtrain.training import Task

        def make_task():
            x = torch.randn(16, 2)
            y = (x.sum(1) > 0).long()
            model = torch.nn.Linear(2, 2)
            data = DataLoader(TensorDataset(x, y), batch_size=8)
            return Task(model, torch.optim.SGD(model.parameters(), lr=0.1), data, data,
                        loss_fn=torch.nn.functional.cross_entropy)
        """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "s.toml"
    path.write_text(f'[run]\ntask = "{name}:make_task"\nmax_epochs = 2\ndevice = "cpu"\n'
                    + _spec("MaxSaver", "val/accuracy", None, "improved", None))
    assert main(["check", str(path)]) == 0
    checked = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert len(checked) == 1 and "callbacks.keep.trigger.all[1].improved" in checked[0]
    assert main(["train", str(path), "--run-dir", "out"]) == 0
    trained = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert trained == checked
