"""Each host killed and resumed its own way agrees with ``simulate()``: random schedules,
shapes (partial accumulation steps at an epoch's end where the host takes them, uneven
last batches) and kill points (any micro-batch; resumed from the newest checkpoint, or
afresh before the first). The firings (every counter but time) and the host step each
action observed over the interrupted and resumed run are ``simulate()``'s.
``benchmarks/host_agreement.py`` runs many such cases per host as a table."""

from __future__ import annotations

import pytest

pytest.importorskip("ignite")  # Lightning and HF: host_agreement's imports skip
from host_agreement import Case, Shape, cases, check
from hypothesis import HealthCheck, example, given, settings

from schedtrain import Schedule, every, on

quiet = pytest.mark.filterwarnings("ignore")
# killed just after an epoch's last step (its checkpoint written, its epoch_end not yet
# fired): the epoch boundary is caught up in the resumed run, with the host at the step
EDGE = Schedule({"end": every("1 epoch"), "start": on("epoch_start"), "step": every("2 steps"),
                 "batch": every("1 batch")})
few = settings(max_examples=10, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@quiet
class TestKilledAndResumed:
    @few
    @given(case=cases("lightning"))
    @example(case=Case("lightning", EDGE, Shape(3, 3, 2, 2, 1), 3))  # a partial step
    # killed after the fit's last step, before its epoch end: the resumed fit runs no
    # batch, and the saved epoch ends before train_end
    @example(case=Case("lightning", EDGE, Shape(2, 3, 2, 2, 1), 6))
    # killed mid-epoch before an uneven last batch: the loader resumes at it (a plain
    # DataLoader would run the epoch's first, full batch again in its place)
    @example(case=Case("lightning", Schedule({"b": every("1 batch")}), Shape(1, 2, 1, 3, 1), 1))
    def test_lightning(self, case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
        """``ModelCheckpoint(every_n_train_steps=1)``, killed at a batch's start, resumed
        with ``fit(ckpt_path=...)``."""
        check(case, tmp_path_factory.mktemp("pl"))

    @settings(few, max_examples=4)
    @given(case=cases("transformers"))
    @example(case=Case("transformers", EDGE, Shape(2, 3, 2, 2, 1), 3))
    @example(case=Case("transformers", EDGE, Shape(2, 3, 2, 2, 1), 6))  # after the last
    def test_transformers(self, case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
        """``save_steps=1``, killed at the hook after a micro-batch, resumed with
        ``train(resume_from_checkpoint=...)``."""
        check(case, tmp_path_factory.mktemp("hf"))

    @settings(few, max_examples=25)
    @given(case=cases("ignite"))
    @example(case=Case("ignite", EDGE, Shape(3, 4, 2, 2, 1), 4))
    @example(case=Case("ignite", Schedule({"b": every("1 batch")}), Shape(1, 2, 1, 3, 1), 1))
    def test_ignite(self, case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
        """``Checkpoint`` of a ``DeterministicEngine`` (it resumes its data mid-epoch) and
        the schedule at every step, killed after an iteration, resumed with
        ``Checkpoint.load_objects``."""
        check(case, tmp_path_factory.mktemp("ig"))
