"""A checkpoint taken inside an epoch on N processes resumes on M != N: the epoch's rest
is re-divided (none repeated, none skipped), the counters continue and the schedule
fires where simulate() of the changed shape says. The rules of the division are
property-tested against torch's own samplers; real runs go through torchrun/gloo."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_distributed import events
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchrun_helpers import forked_ranks

from schedtrain import Schedule, every, on
from schedtrain.checkpoints.restore import own_part
from schedtrain.checkpoints.rng import rng_state, set_rng_state
from schedtrain.testing import simulate
from schedtrain.training.data_position import DataPosition
from schedtrain.training.redivide import deal, first_stretch, order_of, rest_of

SIZE, BATCH, EPOCHS = 96, 4, 2

# -- the rules, against torch's samplers ----------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(rest=st.lists(st.integers(0, 10_000), unique=True, max_size=200),
       ranks=st.integers(1, 9), batch=st.integers(1, 9), drop_last=st.booleans())
def test_deal_gives_every_rank_as_many_batches_and_repeats_or_skips_nothing(
        rest: list[int], ranks: int, batch: int, drop_last: bool) -> None:
    per_rank = deal(rest, ranks, batch, drop_last)
    assert len(per_rank) == ranks
    assert len({len(b) for b in per_rank}) == 1  # DDP: every rank steps alike
    assert all(0 < len(b) <= batch for batches in per_rank for b in batches)
    dealt = [i for batches in per_rank for b in batches for i in b]
    if drop_last:  # only what cannot fill a batch on every rank is left out
        assert len(set(dealt)) == len(dealt)
        assert len(rest) - len(dealt) < ranks * batch + ranks
        return
    assert set(dealt) == set(rest)
    if len(rest) >= ranks and (batch > 1 or len(rest) % ranks == 0):
        assert len(dealt) == len(rest)  # none repeated
    else:  # padded as DistributedSampler pads: fewer than `ranks` repeats
        assert len(dealt) - len(rest) < ranks


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 60), ranks=st.integers(1, 5), batch=st.integers(1, 7),
       epoch=st.integers(0, 3), flags=st.tuples(st.booleans(), st.booleans()))
def test_the_first_stretch_is_what_distributed_samplers_give(
        size: int, ranks: int, batch: int, epoch: int, flags: tuple[bool, bool]) -> None:
    shuffle, drop_last = flags
    data: Any = list(range(size))
    loaders: list[DataLoader[Any]] = []
    for rank in range(ranks):
        sampler: DistributedSampler[Any] = DistributedSampler(
            data, num_replicas=ranks, rank=rank, shuffle=shuffle, seed=7, drop_last=drop_last)
        sampler.set_epoch(epoch)
        loaders.append(DataLoader(data, batch_size=batch, sampler=sampler,
                                  drop_last=drop_last))
    order, per_rank = first_stretch(order_of(loaders[0], None), ranks, size=size,
                                    epoch=epoch, batch_size=batch, drop_last=drop_last)
    assert sorted(order) == data
    assert per_rank == [[b.tolist() for b in loader] for loader in loaders]


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 60), batch=st.integers(1, 7), shuffle=st.booleans(),
       drop_last=st.booleans(), seed=st.integers(0, 2**31))
def test_the_first_stretch_on_one_process_replays_its_shuffle(
        size: int, batch: int, shuffle: bool, drop_last: bool, seed: int) -> None:
    data: Any = list(range(size))
    loader: DataLoader[Any] = DataLoader(data, batch_size=batch, shuffle=shuffle,
                                         drop_last=drop_last)
    torch.manual_seed(seed)
    start = rng_state()
    seen = [b.tolist() for b in loader]
    torch.manual_seed(seed + 1)  # the replay does not depend on the generators now
    order, per_rank = first_stretch(order_of(loader, start), 1, size=size, epoch=0,
                                    batch_size=batch, drop_last=drop_last)
    assert per_rank == [seen] and sorted(order) == list(range(size))


@settings(max_examples=60, deadline=None)
@given(ranks=st.integers(1, 4), others=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       data=st.data())
def test_a_chain_of_divisions_covers_the_epoch_once(ranks: int, others: list[int],
                                                    data: st.DataObject) -> None:
    """Stretches on any numbers of ranks, each cut at any batch: what they took and the
    rest that is left partition the epoch."""
    order, per_rank = first_stretch({"seed": 3, "shuffle": True, "drop_last": False},
                                    ranks, size=SIZE, epoch=1, batch_size=BATCH,
                                    drop_last=False)
    stretches = [(per_rank, data.draw(st.integers(0, len(per_rank[0]))))]
    for n in others:
        rest = rest_of(order, stretches)
        dealt = deal(rest, n, BATCH, False)
        stretches.append((dealt, data.draw(st.integers(0, len(dealt[0])))))
    taken = [i for batches, count in stretches for rank in batches for b in rank[:count]
             for i in b]
    left = rest_of(order, stretches)
    assert sorted(set(taken) | set(left)) == list(range(SIZE))
    assert not set(taken) & set(left)
    assert left == [i for i in order if i in set(left)]  # in the epoch's order


def _position_state(ranks: int, *, stateful: bool = False) -> dict[str, Any]:
    data: Any = list(range(SIZE))
    loader: DataLoader[Any] = DataLoader(data, batch_size=BATCH, shuffle=True)
    position = DataPosition(loader)
    position.start_epoch(0)
    state = position.state_dict()
    if stateful:
        state = {"loader": {}}
    return {"epoch_open": True, "clock": {"now": {"step": 3}},
            "ranks": [{"rng": rng_state(), "data": state} for _ in range(ranks)]}


@pytest.mark.parametrize("stateful", [True, False])
def test_data_that_cannot_be_redivided_is_refused_in_one_line(stateful: bool) -> None:
    run = _position_state(2, stateful=stateful)
    if not stateful:
        del run["ranks"][0]["data"]["split"]  # a user's sampler: no division recorded
    with pytest.raises(ValueError, match="inside an epoch on 2 processes") as info:
        own_part(None, "ck.pt", run)
    text = str(info.value)
    assert "\n" not in text and "resume it on 2" in text
    assert ("StatefulDataLoader" in text) == stateful


def test_a_divisible_checkpoint_carries_the_one_line_note() -> None:
    now = rng_state()
    _, data = own_part(None, "ck.pt", _position_state(2))
    set_rng_state(now)
    assert "re-divided among 1" in data["note"] and "\n" not in data["note"]


class _Comm:
    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank


def _loader(ranks: int, rank: int, size: int) -> DataLoader[Any]:
    """The training loader on rank ``rank`` of ``ranks``, as shard_data makes it."""
    data = TensorDataset(torch.arange(size))
    if ranks == 1:
        return DataLoader(data, batch_size=BATCH, shuffle=True)
    return DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(
        data, num_replicas=ranks, rank=rank, shuffle=True, seed=5))


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 6).map(lambda n: 12 * n),
       worlds=st.lists(st.integers(1, 4), min_size=2, max_size=4),
       epoch=st.integers(0, 2), data=st.data())
def test_a_chain_of_resumes_on_other_numbers_of_ranks_sees_each_sample_once(
        size: int, worlds: list[int], epoch: int, data: st.DataObject) -> None:
    """The data positions themselves, ranks simulated in one process: an epoch started on
    worlds[0] ranks, checkpointed inside it and resumed on each next number of ranks in
    turn, is seen whole and once (sizes divisible by 1 to 4: nothing padded), every rank
    taking as many batches, and ``epoch_batches`` counts the epoch's batches a rank."""
    now = rng_state()
    positions = [DataPosition(_loader(worlds[0], r, size), worlds[0])
                 for r in range(worlds[0])]
    iters = [iter(p.start_epoch(epoch)) for p in positions]
    consumed, seen = 0, []
    for world in worlds[1:]:
        first = positions[0]
        left = (first.epoch_batches if first.epoch_batches is not None
                else len(first.data)) - consumed  # type: ignore[arg-type]
        take = data.draw(st.integers(0, max(left - 1, 0)))
        for it in iters:
            seen += [i for _ in range(take) for i in next(it)[0].tolist()]
        consumed += take
        saved = [{"rng": rng_state(), "data": p.state_dict()} for p in positions]
        run = {"epoch_open": True, "clock": {"now": {"step": consumed}},
               **({"ranks": saved} if len(saved) > 1 else saved[0])}
        positions, iters = [], []
        for rank in range(world):
            _, state = own_part(_Comm(world, rank), "ck.pt", run)  # type: ignore[arg-type]
            assert state.pop("note", None) is not None or world == len(saved)
            position = DataPosition(_loader(world, rank, size), world)
            position.load_state_dict(state)
            iters.append(iter(position.resume_epoch(consumed, epoch)))
            positions.append(position)
    rests = [[i for b in it for i in b[0].tolist()] for it in iters]
    set_rng_state(now)
    assert sorted(seen + [i for r in rests for i in r]) == list(range(size))
    assert len({-(-len(r) // BATCH) for r in rests}) == 1
    divided = len(set(worlds)) > 1  # otherwise the epoch is replayed as it was
    assert {p.epoch_batches for p in positions} == (
        {consumed + -(-len(rests[0]) // BATCH)} if divided else {None})


# -- real runs: torchrun, gloo ---------------------------------------------------------------

SPEC = """\
[run]
task = "jobs.reshard:make_task"
max_epochs = 2
seed = 1

[callbacks.save]
type = "ModelSaver"
keep = 100
trigger = { every = "1 step" }

[callbacks.tick]
type = "jobs.reshard:Tick"
trigger = { any = [{ every = "5 steps" }, { every = "1 epoch" }] }

[callbacks.seen]
type = "jobs.reshard:SeenIndices"
trigger = { on = "train_end" }
"""

SCHEDULE = Schedule({"save": every("1 step"), "tick": every("5 steps") | every("1 epoch"),
                     "seen": on("train_end")})


FSDP_SPEC = SPEC.replace("seed = 1", 'seed = 1\nstrategy = "fsdp"')


def _run_on(folder: Path, ranks: int, spec: str = SPEC) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.toml").write_text(spec)
    result = forked_ranks(folder / "spec.toml", folder / "run", nproc=ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "run"


@pytest.fixture(scope="module")
def on_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_on(tmp_path_factory.mktemp("one"), 1)


@pytest.fixture(scope="module")
def on_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_on(tmp_path_factory.mktemp("two"), 2)


@pytest.fixture(scope="module")
def on_two_sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run_on(tmp_path_factory.mktemp("two-fsdp"), 2, FSDP_SPEC)


def _seen(folder: Path, world: int) -> list[list[list[Any]]]:
    return [json.loads((folder / f"seen-{world}-rank{r}.json").read_text())
            for r in range(world)]


def _steps_per_epoch(ranks: int) -> int:
    return -(-SIZE // ranks) // BATCH


def changed_shape(before: int, after: int, step: int) -> list[int]:
    """The epochs' lengths of a run of EPOCHS epochs checkpointed at ``step`` inside an
    epoch on ``before`` processes and resumed on ``after``: the epoch's rest, dealt evenly,
    takes ceil(ceil(rest / after) / BATCH) more steps."""
    per_before, per_after = _steps_per_epoch(before), _steps_per_epoch(after)
    epoch, done = divmod(step, per_before)
    rest = SIZE - before * BATCH * done
    per_rank = -(-rest // after)
    more = -(-per_rank // BATCH)
    return [per_before] * epoch + [done + more] + [per_after] * (EPOCHS - epoch - 1)


@pytest.mark.parametrize("case", [(2, 1, 5), (2, 1, 19), (1, 2, 7), (1, 2, 30), (2, 3, 9),
                                  (2, 3, 14)], ids=lambda c: "{}-{}-at-{}".format(*c))
def test_a_mid_epoch_checkpoint_resumes_on_another_number_of_processes(
        on_one: Path, on_two: Path, tmp_path: Path, case: tuple[int, int, int]) -> None:
    """(processes before, after, checkpoint step), the step inside an epoch."""
    before, after, step = case
    _resume_and_check({1: on_one, 2: on_two}[before], tmp_path, before=before, after=after,
                      step=step, spec=SPEC)


@pytest.mark.slow
def test_a_mid_epoch_sharded_checkpoint_resumes_on_three(on_two_sharded: Path,
                                                         tmp_path: Path) -> None:
    """The same under FSDP2: a sharded checkpoint from 2 ranks, resharded onto 3."""
    _resume_and_check(on_two_sharded, tmp_path, before=2, after=3, step=14, spec=FSDP_SPEC)


def _resume_and_check(reference: Path, tmp_path: Path, *, before: int, after: int,
                      step: int, spec: str) -> None:
    assert step % _steps_per_epoch(before)  # inside an epoch
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    for later in (run_dir / "checkpoints").glob("step-*"):
        if int(later.name.split(".")[0].split("-")[1]) > step:
            shutil.rmtree(later) if later.is_dir() else later.unlink()
    checkpoint, = (run_dir / "checkpoints").glob(f"step-{step:08d}.*")
    (tmp_path / "spec.toml").write_text(spec)
    result = forked_ranks(tmp_path / "spec.toml", run_dir, "--resume", str(checkpoint),
                      nproc=after)
    assert result.returncode == 0, result.stderr[-3000:]
    # said once, in one line, by the chief
    assert result.stderr.count("are re-divided among") == 1, result.stderr[-3000:]

    # every sample of the resumed epoch exactly once: before the checkpoint on `before`
    # ranks, after it on `after`; and every later epoch whole on `after` ranks
    epoch = step // _steps_per_epoch(before)
    old, new = _seen(reference.parent, before), _seen(tmp_path, after)
    assert all(s > step for rank in new for s, _, _ in rank)
    taken = [i for rank in old for s, e, b in rank if e == epoch and s <= step for i in b]
    for e in range(epoch, EPOCHS):
        rest = [i for rank in new for _, e2, b in rank if e2 == e for i in b]
        assert sorted(rest + (taken if e == epoch else [])) == list(range(SIZE)), e
    assert len({len(rank) for rank in new}) == 1  # every rank stepped alike

    # the schedule fires where simulate() of the changed shape says, and the counters
    # continue: the run ends with the uninterrupted run's samples
    lengths = changed_shape(before, after, step)
    log = simulate(SCHEDULE, epoch_lengths=lengths)
    rows = [r for r in events(run_dir) if r["kind"] == "firing"]
    assert [[r["callback"], r["event"], r["step"]] for r in rows] == \
        [[f.callback, f.event, f.step] for f in log]
    end = [r for r in events(reference) if r["kind"] == "firing"][-1]
    assert rows[-1]["event"] == end["event"] == "train_end"
    assert rows[-1]["sample"] == end["sample"] == EPOCHS * SIZE
    assert rows[-1]["step"] == sum(lengths)

