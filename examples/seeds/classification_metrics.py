"""pytorch-accelerated's ``ClassificationMetricsCallback``: torchmetrics on evaluation steps.

The callback listens to ``eval_step_end`` (``InferenceRunner`` fires it after each
validation batch with the batch and the outputs as payload) to update torchmetrics'
accuracy and confusion matrix, and to ``eval_end`` to compute them. Accuracy is a
scalar and goes to the metric store; the confusion matrix is not (``metrics.put``
refuses it), so it goes to a file of its own in the run directory, one JSON line per
evaluation.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from schedtrain import Schedule, on
from schedtrain.callbacks import Callback, InferenceRunner
from schedtrain.training import Trainer

if not __package__:  # `python examples/seeds/NAME.py`: the repository root holds `examples`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.seeds._data import CLASSES, loaders, model


class ClassificationMetrics(Callback):
    """Accuracy and confusion matrix of each validation pass."""

    produces = ("val/tm_accuracy",)

    def __init__(self, num_classes: int) -> None:
        self.accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.confusion = MulticlassConfusionMatrix(num_classes=num_classes)

    def _setup(self) -> None:
        self.accuracy.to(self.trainer.device)
        self.confusion.to(self.trainer.device)

    def _trigger(self) -> None:
        payload = self.trainer.payload
        if "outputs" in payload:  # eval_step_end
            preds = payload["outputs"].argmax(dim=-1)
            targets = payload["batch"][1]
            self.accuracy.update(preds, targets)
            self.confusion.update(preds, targets)
            return
        # eval_end: the pass is over
        self.metrics.put("val/tm_accuracy", self.accuracy.compute())
        matrix = self.confusion.compute().cpu().tolist()
        if self.trainer.run_dir is not None and self.is_chief:
            with (self.trainer.run_dir / "confusion.jsonl").open("a") as f:
                f.write(json.dumps({"step": self.now.step, "matrix": matrix}) + "\n")
        self.accuracy.reset()
        self.confusion.reset()


def main(run_dir: str | Path | None = None, epochs: int = 3) -> dict[str, Any]:
    """Train, evaluating every epoch; returns the metrics and the confusion matrices."""
    torch.set_num_threads(1)  # a tiny model: one thread is faster (docs/performance.md#cpu-threads)
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="classification-metrics-"))
    train, val = loaders()
    net = model()
    schedule = Schedule({"validate": on("epoch_end"),
                         "metrics": on("eval_step_end") | on("eval_end")})
    trainer = Trainer(net, torch.optim.Adam(net.parameters(), lr=1e-2), train,
                      torch.nn.functional.cross_entropy, val_data=val, max_epochs=epochs,
                      run_dir=run_dir, device="cpu", schedule=schedule,
                      bindings={"validate": InferenceRunner(),
                                "metrics": ClassificationMetrics(CLASSES)})
    trainer.fit()
    lines = (run_dir / "confusion.jsonl").read_text().splitlines()
    result = {"val/accuracy": trainer.metrics.history("val/accuracy"),
              "val/tm_accuracy": trainer.metrics.history("val/tm_accuracy"),
              "confusion": [json.loads(x) for x in lines]}
    for (step, acc), c in zip(result["val/tm_accuracy"], result["confusion"], strict=True):
        print(f"step {step}: accuracy {acc:.3f}, confusion diagonal "
              f"{[c['matrix'][i][i] for i in range(CLASSES)]}")
    return result


if __name__ == "__main__":
    main()
