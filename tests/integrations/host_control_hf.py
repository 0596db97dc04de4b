"""The HF Trainer's adapter for ``host_control_cases``: ``ScheduleCallback(...,
control=...)`` in a ``transformers.Trainer`` over a ``Shape``; a preemption ends
``train()`` with ``HostPreempted`` (exit 75) after HF's own checkpoint, resumed with
``train(resume_from_checkpoint=True)`` (HF's newest ``checkpoint-STEP`` in the folder)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from host_agreement import Shape

from schedtrain import Schedule
from schedtrain.integrations.host_control import HostControl


class TransformersAdapter:
    """HF: the folder is both ``output_dir`` and the control's ``run_dir``."""

    host = "transformers"

    def run(self, schedule: Schedule, shape: Shape, folder: Path, *,
            control: HostControl | None, actions: Mapping[str, Callable[[], None]],
            resume: bool = False) -> Any:
        from host_control_cases import Ran
        from test_integrations_transformers import dataset, model
        from transformers import Trainer, TrainingArguments

        from schedtrain.integrations.transformers import ScheduleCallback

        s = shape

        def act(name: str) -> Callable[..., None]:
            return lambda args, state, control, **kw: actions.get(name, lambda: None)()

        cb = ScheduleCallback(schedule, {n: act(n) for n in schedule.names}, record=True,
                              control=control)
        args = TrainingArguments(
            output_dir=str(folder), use_cpu=True, report_to="none", disable_tqdm=True,
            per_device_train_batch_size=s.rows, gradient_accumulation_steps=s.accum,
            num_train_epochs=s.epochs, logging_strategy="no", eval_strategy="no",
            save_strategy="no", include_num_input_tokens_seen=True, seed=0)
        net = model()
        trainer = Trainer(model=net, args=args,
                          train_dataset=dataset((s.batches - 1) * s.rows + s.last),
                          callbacks=[cb])
        code = 0
        try:
            trainer.train(resume_from_checkpoint=True if resume else None)
        except SystemExit as exc:
            code = int(exc.code or 0)
        return Ran(list(cb.firings), code, [p.detach().clone() for p in net.parameters()])


TRANSFORMERS = TransformersAdapter()
