"""``simulate_ranks``: a schedule as it runs on several processes, without processes.

The library's rules for several processes (docs/distributed.md): steps and epochs are
the same on every rank, samples and tokens are global (summed over ranks), wall time is
the chief's, and metrics are reduced across ranks before any trigger reads them.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schedtrain.testing
from schedtrain import Schedule, every, improved, on, plateau, when, window
from schedtrain.testing import fired_at, simulate, simulate_ranks

#: epoch-stamped val/loss of two ranks: rank 0 alone improves at epochs 1, 2, 4;
#: their mean (0.9, 0.8, 0.65, 0.6) improves at every epoch.
RANK0 = {"val/loss": [("1 epoch", 0.9), ("2 epochs", 0.7), ("3 epochs", 0.8), ("4 epochs", 0.6)]}
RANK1 = {"val/loss": [("1 epoch", 0.9), ("2 epochs", 0.9), ("3 epochs", 0.5), ("4 epochs", 0.6)]}


def _log(schedule: Schedule, **kwargs: Any) -> schedtrain.testing.FiringLog:
    return simulate_ranks(schedule, epochs=4, steps_per_epoch=10, **kwargs)


class TestOneRank:
    """With ``world_size=1`` the run is the one-process run."""

    def test_equals_simulate(self) -> None:
        """Clock, rates, time and metric triggers fire exactly as ``simulate`` says."""
        schedule = Schedule({
            "tok": every("250 tokens"),
            "smp": every("96 samples") & window(stop="3 epochs"),
            "sec": every("1 s"),
            "best": every("1 epoch") & improved("val/loss"),
            "low": every("5 steps") & when("val/loss < 0.75"),
            "end": on("train_end"),
        })
        shape = {"epochs": 4, "steps_per_epoch": 10, "batches_per_step": 2,
                 "seconds_per_step": 0.3, "samples_per_batch": 16, "tokens_per_batch": 30}
        got = simulate_ranks(schedule, world_size=1, rank_metrics=[RANK0], **shape)
        assert got == simulate(schedule, metrics=RANK0, **shape)
        assert len(got) > 0

    def test_plain_metrics_equal_simulate(self) -> None:
        """Metrics given already reduced go through unchanged."""
        schedule = Schedule({"best": every("1 epoch") & improved("val/loss")})
        assert _log(schedule, world_size=3, metrics=RANK0) == simulate(
            schedule, epochs=4, steps_per_epoch=10, metrics=RANK0)

    def test_is_exported_from_testing(self) -> None:
        """``schedtrain.testing`` exports it, and returns a ``FiringLog``."""
        assert "simulate_ranks" in schedtrain.testing.__all__
        log = simulate_ranks(Schedule({"a": every("1 step")}), world_size=2, epochs=1,
                             steps_per_epoch=3)
        assert isinstance(log, schedtrain.testing.FiringLog)
        assert log.steps("a") == [1, 2, 3]


class TestGlobalCounters:
    """Samples and tokens count over all ranks; steps, epochs and time do not."""

    def test_tokens_are_summed_over_ranks(self) -> None:
        """1000 tokens at 100 tokens per batch on 2 ranks: every 5 steps, not 10."""
        schedule = Schedule({"t": every("1000 tokens")})
        log = simulate_ranks(schedule, world_size=2, epochs=1, steps_per_epoch=20,
                             tokens_per_batch=100)
        assert fired_at(log, "t") == [5, 10, 15, 20]
        assert fired_at(log, "t", "tokens") == [1000, 2000, 3000, 4000]

    def test_rate_scales_with_world_size(self) -> None:
        """The same spec fires twice as often in steps on twice the ranks."""
        schedule = Schedule({"s": every("512 samples")})
        steps = {n: simulate_ranks(schedule, world_size=n, epochs=1, steps_per_epoch=16,
                                   samples_per_batch=32).steps("s") for n in (1, 2, 4)}
        assert steps == {1: [16], 2: [8, 16], 4: [4, 8, 12, 16]}

    def test_per_rank_sizes_are_summed(self) -> None:
        """``[32, 32]`` is 32 on each of two ranks; uneven sizes add up too."""
        schedule = Schedule({"s": every("640 samples")})
        kw: dict[str, Any] = {"world_size": 2, "epochs": 1, "steps_per_epoch": 30}
        same = simulate_ranks(schedule, samples_per_batch=[32, 32], **kw)
        assert same == simulate_ranks(schedule, samples_per_batch=32, **kw)
        assert same.steps("s") == [10, 20, 30]
        uneven = simulate_ranks(schedule, samples_per_batch=[30, 34], **kw)
        assert uneven.steps("s") == [10, 20, 30]
        assert fired_at(simulate_ranks(schedule, samples_per_batch=[60, 20], **kw), "s") == [
            8, 16, 24]

    def test_micro_batches_count_on_every_rank(self) -> None:
        """Under accumulation each rank's micro-batches add their tokens."""
        schedule = Schedule({"t": every("1200 tokens")})
        log = simulate_ranks(schedule, world_size=3, epochs=1, steps_per_epoch=8,
                             batches_per_step=2, tokens_per_batch=100)
        assert log.steps("t") == [2, 4, 6, 8]

    def test_steps_and_epochs_do_not_scale(self) -> None:
        """Step and epoch triggers fire at the same points on any number of ranks."""
        schedule = Schedule({"s": every("3 steps"), "e": every("1 epoch")})
        one = simulate_ranks(schedule, world_size=1, epochs=2, steps_per_epoch=6)
        assert simulate_ranks(schedule, world_size=4, epochs=2, steps_per_epoch=6) == one

    def test_time_is_the_chiefs(self) -> None:
        """``seconds_per_step`` is rank 0's: time triggers ignore the world size."""
        schedule = Schedule({"t": every("1 s")})
        for n in (1, 2, 8):
            log = simulate_ranks(schedule, world_size=n, epochs=1, steps_per_epoch=12,
                                 seconds_per_step=0.25)
            assert log.steps("t") == [4, 8, 12]


class TestReducedMetrics:
    """Triggers see each metric reduced across ranks, the mean by default."""

    def test_improved_follows_the_mean(self) -> None:
        """``improved`` fires where the mean improves, not where rank 0's value does."""
        schedule = Schedule({"best": every("1 epoch") & improved("val/loss")})
        assert simulate(schedule, epochs=4, steps_per_epoch=10,
                        metrics=RANK0).epochs("best") == [1, 2, 4]
        log = _log(schedule, world_size=2, rank_metrics=[RANK0, RANK1])
        assert log.epochs("best") == [1, 2, 3, 4]
        assert not any(f.conditional for f in log)

    def test_condition_follows_the_mean(self) -> None:
        """``when("val/loss < 0.75")``: rank 0 alone passes at epoch 2 (0.7), the mean
        (0.8) does not."""
        schedule = Schedule({"low": every("1 epoch") & when("val/loss < 0.75")})
        assert simulate(schedule, epochs=4, steps_per_epoch=10,
                        metrics=RANK0).epochs("low") == [2, 4]
        assert _log(schedule, world_size=2,
                    rank_metrics=[RANK0, RANK1]).epochs("low") == [3, 4]

    def test_plateau_follows_the_mean(self) -> None:
        """Patience counts the reduced values: the mean never stalls, rank 0 does."""
        schedule = Schedule({"stall": every("1 epoch") & plateau("val/loss", 1)})
        assert simulate(schedule, epochs=4, steps_per_epoch=10,
                        metrics=RANK0).epochs("stall") == [3]
        assert _log(schedule, world_size=2, rank_metrics=[RANK0, RANK1]).epochs("stall") == []

    @pytest.mark.parametrize(("op", "expected"), [
        ("mean", []), ("max", [2]), ("sum", [2]), ("min", []),
    ])
    def test_reduce_op_changes_what_fires(self, op: str, expected: list[int]) -> None:
        """``reduce={"x": op}``: x is (0, 0) then (2, 0); "x > 1" holds only for max, sum."""
        schedule = Schedule({"hi": every("1 epoch") & when("x > 1")})
        streams = [{"x": [("1 epoch", 0.0), ("2 epochs", 2.0)]},
                   {"x": [("1 epoch", 0.0), ("2 epochs", 0.0)]}]
        log = simulate_ranks(schedule, world_size=2, epochs=2, steps_per_epoch=5,
                             rank_metrics=streams, reduce={"x": op})
        assert log.epochs("hi") == expected

    def test_reduce_applies_per_metric(self) -> None:
        """An op for one metric leaves the others at the mean."""
        schedule = Schedule({"x": every("1 step") & when("x > 1"),
                             "y": every("1 step") & when("y > 1")})
        streams = [{"x": [(1, 2.0)], "y": [(1, 2.0)]}, {"x": [(1, 0.0)], "y": [(1, 0.0)]}]
        log = simulate_ranks(schedule, world_size=2, epochs=1, steps_per_epoch=1,
                             rank_metrics=streams, reduce={"x": "max"})
        assert log.callbacks() == ["x"]

    def test_points_may_be_listed_in_any_order(self) -> None:
        """Values are paired by their point, not by their position in the list."""
        schedule = Schedule({"best": every("1 epoch") & improved("val/loss")})
        shuffled = {"val/loss": list(reversed(RANK1["val/loss"]))}
        assert _log(schedule, world_size=2, rank_metrics=[RANK0, shuffled]) == _log(
            schedule, world_size=2, rank_metrics=[RANK0, RANK1])

    def test_step_stamped_and_tuple_streams(self) -> None:
        """Steps given as ints and ``[(at, name, value)]`` lists work as for ``simulate``."""
        schedule = Schedule({"low": every("1 step") & when("loss < 1")})
        log = simulate_ranks(schedule, world_size=2, epochs=1, steps_per_epoch=3,
                             rank_metrics=[[(1, "loss", 0.5), (2, "loss", 2.0)],
                                           {"loss": [(1, 2.0), ("2 steps", 1.0)]}])
        # mean: 1.25 from step 1, 1.5 from step 2
        assert log.steps("low") == []
        log = simulate_ranks(schedule, world_size=2, epochs=1, steps_per_epoch=3,
                             rank_metrics=[[(1, "loss", 0.5), (2, "loss", 0.2)],
                                           {"loss": [(1, 2.0), ("2 steps", 1.0)]}])
        assert log.steps("low") == [2, 3]

    def test_plain_and_per_rank_metrics_combine(self) -> None:
        """Already-reduced metrics and per-rank ones may be given together."""
        schedule = Schedule({"go": every("1 epoch") & when("val/loss < 0.75 and lr > 0")})
        log = _log(schedule, world_size=2, rank_metrics=[RANK0, RANK1],
                   metrics={"lr": [(0, 0.1)]})
        assert log.epochs("go") == [3, 4]


class TestValidation:
    """Bad arguments are refused with a message naming what is wrong."""

    @pytest.mark.parametrize("n", [0, -1, True, 1.5, "2"])
    def test_world_size(self, n: object) -> None:
        """``world_size`` must be a whole number >= 1."""
        with pytest.raises(ValueError, match=r"world_size must be a whole number >= 1"):
            simulate_ranks(Schedule({"a": every("1 step")}), world_size=n,  # type: ignore[arg-type]
                           epochs=1, steps_per_epoch=1)

    def test_unknown_reduce_op(self) -> None:
        """An unknown op names the metric and lists the valid ones."""
        with pytest.raises(ValueError, match=r"reduce\['val/loss'\] must be one of "
                           r"\['mean', 'sum', 'max', 'min'\], got 'median'"):
            _log(Schedule({"a": every("1 step")}), world_size=2, reduce={"val/loss": "median"})

    def test_rank_metrics_length(self) -> None:
        """One stream per rank, no more, no less."""
        with pytest.raises(ValueError, match=r"rank_metrics gives 1 metric streams, expected "
                           r"one per rank: 2"):
            _log(Schedule({"a": every("1 step")}), world_size=2, rank_metrics=[RANK0])

    def test_rank_metrics_must_be_a_list(self) -> None:
        """A single mapping is refused, pointing at ``metrics=`` for reduced values."""
        with pytest.raises(ValueError, match=r"one per rank.*metrics="):
            _log(Schedule({"a": every("1 step")}), world_size=1, rank_metrics=RANK0)  # type: ignore[arg-type]

    def test_points_differ(self) -> None:
        """A metric at different points on two ranks names the metric, rank and points."""
        other = {"val/loss": [("1 epoch", 0.9), ("2 epochs", 0.9), ("3 epochs", 0.5),
                              ("35 steps", 0.6)]}
        with pytest.raises(ValueError, match=r"metric 'val/loss' is given at different points "
                           r"on rank 2 than on rank 0 \(only on rank 0: \[4 epochs\]; only on "
                           r"rank 2: \[35 steps\]\)"):
            _log(Schedule({"a": every("1 step")}), world_size=3,
                 rank_metrics=[RANK0, RANK1, other])

    def test_metric_missing_on_a_rank(self) -> None:
        """A metric one rank never gives is refused, naming that rank."""
        with pytest.raises(ValueError, match=r"'val/loss' .* on rank 1 .*only on rank 1: none"):
            _log(Schedule({"a": every("1 step")}), world_size=2, rank_metrics=[RANK0, {}])
        with pytest.raises(ValueError, match=r"'acc' .* on rank 1 .*only on rank 0: none"):
            _log(Schedule({"a": every("1 step")}), world_size=2,
                 rank_metrics=[RANK0, {**RANK1, "acc": [(3, 1.0)]}])

    def test_metric_given_both_ways(self) -> None:
        """A metric is given reduced or per rank, not both."""
        with pytest.raises(ValueError, match=r"metric 'val/loss' is given both in metrics"):
            _log(Schedule({"a": every("1 step")}), world_size=2, rank_metrics=[RANK0, RANK1],
                 metrics={"val/loss": [(1, 0.5)]})

    def test_per_rank_sizes(self) -> None:
        """A per-rank size list needs one whole number >= 0 per rank."""
        s = Schedule({"a": every("1 step")})
        with pytest.raises(ValueError, match=r"samples_per_batch lists 3 per-rank sizes, "
                           r"expected one per rank: 2"):
            _log(s, world_size=2, samples_per_batch=[1, 2, 3])
        with pytest.raises(ValueError, match=r"tokens_per_batch\[1\] must be a whole number "
                           r">= 0, got -5"):
            _log(s, world_size=2, tokens_per_batch=[5, -5])
        with pytest.raises(ValueError, match=r"samples_per_batch must be a whole number >= 0, "
                           r"got -1"):
            _log(s, world_size=2, samples_per_batch=-1)

    @pytest.mark.parametrize("op", ["mean", "sum", "max", "min"])
    def test_a_nan_on_any_rank_is_seen_whatever_the_order(self, op: str) -> None:
        """A NaN put on any rank is the reduced value, as in a real run's agreement, for
        every op and wherever the NaN rank is (Python's ``max`` alone depends on it)."""
        schedule = Schedule({"low": every("1 epoch") & when("val/loss != val/loss")})
        nan = {"val/loss": [("1 epoch", float("nan"))]}
        one = {"val/loss": [("1 epoch", 1.0)]}
        for ranks in ([nan, one], [one, nan]):
            log = _log(schedule, world_size=2, rank_metrics=ranks, reduce={"val/loss": op})
            assert fired_at(log, "low", "epochs") == [1, 2, 3, 4]  # it stays the latest


# -- property: the multi-rank run is the one-process run of the agreed clock and metrics --

POINTS = st.sampled_from([*(f"{e} epochs" for e in range(4)), *range(13)])
VALUES = st.integers(0, 8).map(lambda v: v / 8)  # exact in binary, and so are their sums


@st.composite
def rank_runs(draw: st.DrawFn) -> tuple[int, list[dict[str, list[tuple[Any, float]]]],
                                        list[int], int]:
    n = draw(st.integers(1, 4))
    names = draw(st.lists(st.sampled_from(["loss", "acc"]), min_size=1, max_size=2,
                          unique=True))
    at = {m: draw(st.lists(POINTS, max_size=6)) for m in names}
    streams = [{m: [(p, draw(VALUES)) for p in at[m]] for m in names} for _ in range(n)]
    samples = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    tokens = draw(st.integers(0, 7))
    return n, streams, samples, tokens


SCHEDULE = Schedule({
    "best": every("1 epoch") & improved("loss"),
    "acc_up": every("2 steps") & improved("acc", mode="max", min_delta=0.1),
    "stall": every("1 step") & plateau("loss", 2),
    "cond": every("1 step") & when("loss < 0.5 or acc >= 0.75"),
    "smp": every("12 samples"),
    "tok": every("20 tokens") & window(start="3 steps"),
})


@given(rank_runs(), st.integers(2, 4), st.sampled_from([1, 2]))
def test_equals_simulate_with_mean_stream_and_global_rates(
    run: tuple[int, list[dict[str, list[tuple[Any, float]]]], list[int], int],
    steps_per_epoch: int, batches_per_step: int,
) -> None:
    """For random per-rank streams on 1-4 ranks, ``simulate_ranks`` is ``simulate`` of
    the pointwise mean stream with samples and tokens summed over ranks."""
    n, streams, samples, tokens = run
    mean = {m: [(p, sum(s[m][i][1] for s in streams) / n) for i, (p, _) in enumerate(series)]
            for m, series in streams[0].items()}
    shape: dict[str, Any] = {"epochs": 3, "steps_per_epoch": steps_per_epoch,
                             "batches_per_step": batches_per_step, "seconds_per_step": 0.5}
    got = simulate_ranks(SCHEDULE, world_size=n, rank_metrics=streams,
                         samples_per_batch=samples, tokens_per_batch=tokens, **shape)
    want = simulate(SCHEDULE, metrics=mean, samples_per_batch=sum(samples),
                    tokens_per_batch=tokens * n, **shape)
    assert got == want


# -- many ranks: the same rule, however each rank spells and orders its stream --------------


def _respelled(stream: dict[str, list[tuple[Any, float]]], how: int
               ) -> dict[str, list[tuple[Any, float]]] | list[tuple[Any, str, float]]:
    """The same records, told differently: steps as "N steps" (1), each metric's records
    in another order that keeps the order of a point's own values (2), or as a list of
    ``(at, name, value)`` (3); 0 leaves it as it is."""
    if how == 1:
        return {m: [(f"{p} steps" if isinstance(p, int) else p, v) for p, v in s]
                for m, s in stream.items()}
    if how == 2:
        return {m: sorted(s, key=lambda r: str(r[0]), reverse=True) for m, s in stream.items()}
    if how == 3:
        return [(p, m, v) for m, s in stream.items() for p, v in s]
    return stream


@given(rank_runs(), st.lists(st.integers(0, 3), min_size=4, max_size=4),
       st.sampled_from(["mean", "sum", "max", "min"]))
def test_how_a_rank_spells_or_orders_its_stream_does_not_matter(
    run: tuple[int, list[dict[str, list[tuple[Any, float]]]], list[int], int],
    hows: list[int], op: str,
) -> None:
    """Ranks that name rank 0's points exactly, or the same points spelled, ordered or
    laid out otherwise, reduce to the same stream: the k-th value of a metric at a point
    meets the k-th values of the other ranks there."""
    n, streams, samples, tokens = run
    shape: dict[str, Any] = {"epochs": 3, "steps_per_epoch": 3, "samples_per_batch": samples,
                             "tokens_per_batch": tokens, "reduce": {"loss": op, "acc": op}}
    told = [streams[0], *(_respelled(s, h) for s, h in zip(streams[1:], hows, strict=False))]
    assert simulate_ranks(SCHEDULE, world_size=n, rank_metrics=told, **shape) == \
        simulate_ranks(SCHEDULE, world_size=n, rank_metrics=streams, **shape)


@pytest.mark.parametrize("op", ["mean", "max"])
def test_1024_ranks_equal_the_two_rank_run_they_repeat(op: str) -> None:
    """1,024 ranks, each with its own clock rates and a value at every step, equal the
    two-rank run whose ranks they repeat (512 times each; rates scaled to the same
    global counts) and the one-process run of the reduced stream."""
    steps = 120
    pair = [{"loss": [(s, (s * (r + 3)) % 16 / 16) for s in range(1, steps + 1)],
             "acc": [(f"{e} epochs", (e + r) / 8) for e in range(1, 5)]} for r in (0, 1)]
    shape: dict[str, Any] = {"epochs": 4, "steps_per_epoch": steps // 4,
                             "seconds_per_step": 0.25, "reduce": {"loss": op, "acc": op}}
    many = simulate_ranks(SCHEDULE, world_size=1024, rank_metrics=pair * 512,
                          samples_per_batch=[1, 3] * 512, tokens_per_batch=[0, 1] * 512,
                          **shape)
    two = simulate_ranks(SCHEDULE, world_size=2, rank_metrics=pair,
                         samples_per_batch=[512, 3 * 512], tokens_per_batch=[0, 512], **shape)
    assert many == two
    assert {"best", "stall", "smp", "tok"} <= {f.callback for f in many}
