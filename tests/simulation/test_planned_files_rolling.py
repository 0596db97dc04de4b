"""``planned_files`` decides each save's files as it comes (``_Rolling``) for savers with
``Latest`` and ``Every`` rules: the same files, after every save, as replaying the rules
over all of a saver's files at each save (their definition)."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.retention import AnyOf, Best, Every, Latest, Policy, Saved, retained, saved_at
from schedtrain.schedule.firings import Firing
from schedtrain.simulation.files import SaverFiles, planned_files
from schedtrain.time import Timestamp

_BETWEEN = frozenset({"train_start", "epoch_end", "train_end"})


def replayed(log: list[Firing], keep: Mapping[str, SaverFiles]) -> list[tuple[str, ...]]:
    """The straightforward way: at each save, the rules over all the files there."""
    saved: dict[str, list[Saved]] = {name: [] for name in keep}
    out = []
    for f in log:
        if f.callback not in keep:
            continue
        saver, mine = keep[f.callback], saved[f.callback]
        name = saver.name(f.step, f.epoch, f.callback)
        made = Saved(name, saved_at(f.timestamp, between_epochs=f.event in _BETWEEN), True, {})
        mine[:] = [s for s in mine if s.name != name]
        mine.append(made)
        kept = retained(saver.keep, mine)
        mine[:] = [s for i, s in enumerate(mine) if i in kept]
        out.append(tuple(s.name for s in mine))
    return out


rules = st.one_of(
    st.builds(Latest, st.integers(1, 4)),
    st.builds(lambda n, unit: Every(f"{n} {unit}"), st.integers(1, 12),
              st.sampled_from(["steps", "epochs", "batches", "s"])),
    st.builds(lambda n: Best(n, "val/loss"), st.integers(1, 2)),
)
policies: st.SearchStrategy[Policy | None] = st.one_of(
    st.none(), rules, st.lists(rules, min_size=1, max_size=3).map(AnyOf))
kinds = st.sampled_from(["model", "transformers", "lightning", "host"])


@st.composite
def logs(draw: st.DrawFn) -> list[Firing]:
    """Firings of two savers and a bystander: steps that stay or grow (a save at a step
    end and at the epoch end of the same step names one file twice), epochs of 5 steps,
    a second of training time per step."""
    out, step = [], 0
    for _ in range(draw(st.integers(0, 40))):
        step += draw(st.sampled_from([0, 1, 1, 2, 3, 7]))
        event = draw(st.sampled_from(["step_end", "step_end", "epoch_end", "train_end"]))
        epoch = step // 5
        ts = Timestamp.make(step, 2 * step, epoch, step - 5 * epoch, 0, 0, step * 10**9)
        out.append(Firing(draw(st.sampled_from(["a", "b", "other"])), event, ts))
    return out


@settings(max_examples=300, deadline=None)
@given(logs(), policies, policies, kinds)
def test_rolling_files_are_the_rules_replayed(log: list[Firing], a: Policy | None,
                                               b: Policy | None, kind: str) -> None:
    keep = {"a": SaverFiles(kind, a), "b": SaverFiles("model", b)}  # type: ignore[arg-type]
    got = [f.files for f in planned_files(log, keep)]
    assert got == replayed(log, keep)
