"""InferenceRunner's inferencers: ScalarStats, ClassificationError, TorchMetric, TOML tables."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from schedtrain import SpecError
from schedtrain.callbacks import ClassificationError, InferenceRunner, ScalarStats, TorchMetric
from schedtrain.callbacks.inferencers import EvalBatch
from schedtrain.spec import loads_spec
from schedtrain.training import Trainer

torch.set_num_threads(1)


def _batches(scores: torch.Tensor, targets: torch.Tensor, cuts: list[int]) -> list[EvalBatch]:
    """The data split at ``cuts`` (sorted sample indexes) into batches."""
    edges = [0, *sorted({c for c in cuts if 0 < c < len(targets)}), len(targets)]
    return [EvalBatch(scores[a:b], targets[a:b], None, b - a)
            for a, b in itertools.pairwise(edges)]


def _run(inferencer: object, batches: list[EvalBatch]) -> dict[str, float]:
    inferencer.reset(torch.device("cpu"))  # type: ignore[attr-defined]
    for b in batches:
        inferencer.update(b)  # type: ignore[attr-defined]
    return {k: float(v) for k, v in inferencer.result().items()}  # type: ignore[attr-defined]


@st.composite
def classification(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Distinct scores (no ties at the top-k boundary), class targets and batch cuts."""
    n = draw(st.integers(1, 30))
    classes = draw(st.integers(2, 8))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    scores = torch.stack([torch.randperm(classes, generator=g).float() for _ in range(n)])
    targets = torch.randint(0, classes, (n,), generator=g)
    cuts = draw(st.lists(st.integers(0, n), max_size=5))
    return scores, targets, cuts


class TestClassificationError:
    """Top-k error: the share of samples whose target is outside the k best scores."""

    @settings(max_examples=60, deadline=None)
    @given(classification(), st.integers(1, 8))
    def test_top_k_rule_whatever_the_batches(self, data: tuple, k: int) -> None:
        """Equals the per-sample rank rule, however the samples are split into batches."""
        scores, targets, cuts = data
        k = min(k, scores.shape[1])
        rank = (scores > scores.gather(1, targets[:, None])).sum(1)  # classes scored higher
        expected = float((rank >= k).float().mean())
        got = _run(ClassificationError(k, "err"), _batches(scores, targets, cuts))
        assert got == pytest.approx({"err": expected})

    def test_k_beyond_classes_and_wrong_shapes(self) -> None:
        """k above the number of classes, or outputs that are not scores, say what is wrong."""
        with pytest.raises(ValueError, match="k = 5 but the outputs have 3 classes"):
            _run(ClassificationError(5), [EvalBatch(torch.zeros(2, 3), torch.zeros(2).long(),
                                                    None, 2)])
        with pytest.raises(ValueError, match=r"expected \(N, classes\) scores"):
            _run(ClassificationError(1), [EvalBatch(torch.zeros(2), torch.zeros(2), None, 2)])
        with pytest.raises(ValueError, match="`k` must be a whole number >= 1"):
            ClassificationError(0)


class TestScalarStats:
    """The mean over samples of the loss or of named outputs."""

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=20),
           st.lists(st.integers(0, 20), max_size=4))
    def test_sample_mean_whatever_the_batches(self, values: list[float], cuts: list[int]) -> None:
        """Batch means weighted by batch size give the mean over all samples."""
        v = torch.tensor(values, dtype=torch.float64)
        edges = [0, *sorted({c for c in cuts if 0 < c < len(v)}), len(v)]
        batches = [EvalBatch({"aux": v[a:b]}, None, v[a:b].mean(), b - a)
                   for a, b in itertools.pairwise(edges)]
        got = _run(ScalarStats(["loss", "aux"], prefix="v"), batches)
        assert got["v/loss"] == pytest.approx(float(v.mean()), abs=1e-3)
        assert got["v/aux"] == pytest.approx(float(v.mean()), abs=1e-3)

    def test_missing_output_is_named(self) -> None:
        """A name the outputs do not have is refused, listing what they have."""
        with pytest.raises(ValueError, match=r"no 'acc' \(outputs: \['aux'\]\)"):
            _run(ScalarStats(["acc"]), [EvalBatch({"aux": torch.ones(1)}, None, None, 1)])


def _trainer(runner: InferenceRunner, loss: bool = True) -> Trainer:
    torch.manual_seed(0)
    x = torch.randn(48, 4)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    model = torch.nn.Linear(4, 3)
    data = DataLoader(TensorDataset(x, y), batch_size=8)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                   torch.nn.functional.cross_entropy if loss else None,
                   step_fn=None if loss else (lambda m, b: torch.nn.functional.cross_entropy(
                       m(b[0]), b[1])),
                   callbacks=[runner], val_data=DataLoader(TensorDataset(x, y), batch_size=10),
                   max_epochs=2)


class TestInferenceRunner:
    """The runner puts what its inferencers produce, and declares it."""

    def test_default_is_loss_accuracy_error(self) -> None:
        """Without inferencers: val/loss, val/accuracy and val/error, error = 1 - accuracy."""
        runner = InferenceRunner()
        trainer = _trainer(runner)
        trainer.fit()
        assert runner.produces == ("val/loss", "val/accuracy", "val/error")
        acc, err = trainer.metrics.value("val/accuracy"), trainer.metrics.value("val/error")
        assert acc + err == pytest.approx(1.0)

    def test_default_puts_no_accuracy_for_a_regression(self) -> None:
        """Outputs that are not class scores (a regression) get val/loss, and no
        accuracy or error at all rather than a misleading 0."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
        model = torch.nn.Linear(4, 1)
        runner = InferenceRunner()
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), data,
                          torch.nn.functional.mse_loss, val_data=data, callbacks=[runner],
                          max_epochs=2)
        trainer.fit()
        assert len(trainer.metrics.history("val/loss")) == 2
        assert trainer.metrics.history("val/accuracy") == []
        assert trainer.metrics.history("val/error") == []

    def test_inferencers_produce_their_names(self) -> None:
        """Objects and TOML tables mix; every name is put each pass and declared."""
        runner = InferenceRunner(inferencers=[
            ClassificationError(1, "val-error-top1"),
            {"type": "ClassificationError", "k": 2, "name": "val-error-top2"},
            {"type": "ScalarStats", "names": ["loss"]}])
        trainer = _trainer(runner)
        trainer.fit()
        assert runner.produces == ("val-error-top1", "val-error-top2", "val/loss")
        for name in runner.produces:
            assert len(trainer.metrics.history(name)) == 2
        assert trainer.metrics.value("val-error-top2") <= trainer.metrics.value("val-error-top1")

    def test_no_loss_function_needed_without_loss(self) -> None:
        """A runner whose inferencers never read the loss runs without a loss function."""
        runner = InferenceRunner(inferencers=[ClassificationError(1, "err")])
        trainer = _trainer(runner, loss=False)
        trainer.fit()
        assert "err" in trainer.metrics

    def test_refusals(self) -> None:
        """Duplicate names, non-inferencers and bad tables are refused with their index."""
        with pytest.raises(ValueError, match=r"produce \['e'\] more than once"):
            InferenceRunner(inferencers=[ClassificationError(1, "e"), ClassificationError(2, "e")])
        with pytest.raises(TypeError, match=r"inferencers\[0\].*TorchMetric\(metric"):
            InferenceRunner(inferencers=[_ComputeOnly()])  # type: ignore[list-item]
        with pytest.raises(ValueError, match=r"`inferencers\[1\]`: unknown inferencer"):
            InferenceRunner(inferencers=[ClassificationError(), {"type": "Nope"}])


class _ComputeOnly:
    """Looks like a metric (has ``compute``) but is no inferencer."""

    def compute(self) -> float:
        return 0.0


class TestTorchMetric:
    """Any torchmetrics ``Metric``, wrapped with a name."""

    def test_accuracy_matches_top1_error(self) -> None:
        """MulticlassAccuracy (micro) through TorchMetric is 1 - top-1 error, by class path."""
        pytest.importorskip("torchmetrics")
        runner = InferenceRunner(inferencers=[
            ClassificationError(1, "err"),
            {"type": "TorchMetric", "metric": "torchmetrics.classification:MulticlassAccuracy",
             "args": {"num_classes": 3, "average": "micro"}, "name": "val/acc"}])
        trainer = _trainer(runner)
        trainer.fit()
        assert trainer.metrics.value("val/acc") == pytest.approx(
            1 - trainer.metrics.value("err"), abs=1e-6)

    def test_missing_torchmetrics_is_explained(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without torchmetrics installed the error says how to get it."""
        monkeypatch.setitem(sys.modules, "torchmetrics", None)
        with pytest.raises(ImportError, match="pip install torchmetrics"):
            TorchMetric("torchmetrics.classification:MulticlassAccuracy", "val/acc")

    def test_not_a_metric_is_refused(self) -> None:
        """A class path to something else than a Metric is refused before it is called."""
        pytest.importorskip("torchmetrics")
        with pytest.raises(TypeError, match="not a torchmetrics metric"):
            TorchMetric("collections:OrderedDict", "x")


def _problems(table: str) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        loads_spec(f"[callbacks.v]\ntype = \"InferenceRunner\"\ntrigger = {{ every = \"1 epoch\" "
                   f"}}\n{table}\n")
    return [(p.path, p.message) for p in info.value.problems]


class TestToml:
    """``inferencers = [...]`` is checked by ``schedtrain check``, with key paths."""

    def test_valid_list_loads(self) -> None:
        """The documented form loads."""
        spec = loads_spec('[callbacks.v]\ntype = "InferenceRunner"\n'
                          'trigger = { every = "1 epoch" }\n'
                          'inferencers = [{ type = "ClassificationError", k = 5, name = "e5" },\n'
                          '  { type = "ScalarStats", names = ["loss"] }]\n')
        assert spec.callbacks["v"].args["inferencers"][0]["k"] == 5

    @pytest.mark.parametrize(("table", "path", "message"), [
        ('inferencers = [{ type = "ClassificationError", k = 0 }]',
         "callbacks.v.inferencers[0].k", "expected a whole number >= 1, found integer 0"),
        ('inferencers = [{ type = "ClassificationErorr" }]',
         "callbacks.v.inferencers[0].type", "did you mean 'ClassificationError'"),
        ('inferencers = [{ type = "ScalarStats" }, 3]',
         "callbacks.v.inferencers[1]", "expected a table"),
        ('inferencers = [{ type = "ScalarStats", nmes = ["loss"] }]',
         "callbacks.v.inferencers[0].nmes", "unknown argument 'nmes' for ScalarStats"),
        ('inferencers = [{ type = "TorchMetric", metric = "torchmetrics.F1" }]',
         "callbacks.v.inferencers[0].metric", "expected a class path"),
        ('inferencers = [{ type = "TorchMetric", metric = "a:B" }]',
         "callbacks.v.inferencers[0]", "TorchMetric needs the argument 'name'"),
        ('inferencers = "top1"', "callbacks.v.inferencers", "expected a list of tables"),
    ])
    def test_bad_entries_name_their_path(self, table: str, path: str, message: str) -> None:
        """Each bad entry is reported at its own key path with what was expected."""
        problems = _problems(table)
        assert any(p == path and message in m for p, m in problems), problems


class TestTensorpackForm:
    """``InferenceRunner(data, [inferencers])``, tensorpack's positional form."""

    def test_positional_list(self) -> None:
        """A list in the second place is the inferencers: the run puts their metrics and
        the trainer's loss function stays the loss."""
        x = torch.randn(40, 4, generator=torch.Generator().manual_seed(1))
        val = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=10)
        runner = InferenceRunner(val, [ClassificationError(1, "val-error-top1"),
                                       ScalarStats(("loss",))])
        trainer = _trainer(runner)
        trainer.fit()
        assert runner.produces == ("val-error-top1", "val/loss")
        assert len(trainer.metrics.history("val-error-top1")) == 2
        assert runner.loss_fn is torch.nn.functional.cross_entropy

    def test_positional_single_inferencer(self) -> None:
        """One inferencer in the second place, as tensorpack also accepts."""
        runner = InferenceRunner(None, ClassificationError(1, "err"))
        assert runner.produces == ("err",)
        assert runner.loss_fn is None

    @pytest.mark.parametrize(("args", "kwargs", "message"), [
        ((None, "loss"), {}, r"`loss_fn` \(the second argument\) must be a function"),
        ((None, 3), {}, r"`loss_fn` .* or, as in tensorpack, a list of inferencers, got int 3"),
        ((None, _ComputeOnly()), {}, r"`loss_fn`.*TorchMetric\(metric"),
        ((None, [ClassificationError()]), {"inferencers": [ClassificationError()]},
         "inferencers given twice"),
        ((None, [object()]), {}, r"`inferencers\[0\]` must be an inferencer"),
        ((5,), {}, r"`data` must be an iterable of \(inputs, targets\) batches"),
        (("val.pt",), {}, r"`data` must be an iterable.*got str"),
        ((), {"inferencers": "ClassificationError"}, r"`inferencers` must be a list"),
    ])
    def test_refused_at_construction(self, args: tuple[object, ...], kwargs: dict[str, object],
                                     message: str) -> None:
        """Anything unusable is refused when the runner is built, naming the argument,
        not at the first epoch end."""
        with pytest.raises(TypeError, match=message):
            InferenceRunner(*args, **kwargs)  # type: ignore[arg-type]
