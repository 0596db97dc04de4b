"""A lifecycle's spec, drawn once: the run's options, a schedule (which may change along
the run's life) and the saver's keep policy (which may change on a resume). Rendered as a
TOML spec the command line trains."""

from __future__ import annotations

import attrs
from jobs.lifecycle import STEPS_PER_EPOCH

#: The digest callback: on train_end it writes the model's weights' digest in the run
#: directory (jobs.lifecycle), so a finished run's weights are compared exactly.
DIGEST = "jobs.lifecycle:Digest"


@attrs.frozen
class Schedule:
    """The callbacks' triggers: ``validate`` (an InferenceRunner) every ``validate``
    (a period such as "2 epochs" or "5 steps"), ``ckpt`` (a ModelSaver) every ``ckpt``
    ("auto" or a period), also at train_end where ``ckpt_end``; ``best`` (a MinSaver
    on val/loss) where validate fires and val/loss improved, where ``best``."""

    validate: str = "1 epoch"
    ckpt: str = "5 steps"
    ckpt_end: bool = False
    best: bool = True

    def callbacks(self, keep: str) -> str:
        ckpt = f'{{ every = "{self.ckpt}" }}'
        if self.ckpt_end:
            ckpt = f'{{ any = [{ckpt}, {{ on = "train_end" }}] }}'
        out = [f'[callbacks.validate]\ntype = "InferenceRunner"\n'
               f'trigger = {{ every = "{self.validate}" }}\n',
               f'[callbacks.ckpt]\ntype = "ModelSaver"\nkeep = {keep}\ntrigger = {ckpt}\n']
        if self.best:
            out.append(f'[callbacks.best]\ntype = "MinSaver"\nmonitor = "val/loss"\n'
                       f'trigger = {{ all = [{{ every = "{self.validate}" }}, '
                       f'{{ improved = "val/loss" }}] }}\n')
        out.append(f'[callbacks.digest]\ntype = "{DIGEST}"\ntrigger = {{ on = "train_end" }}\n')
        return "\n".join(out)

    def retimable(self, other: Schedule) -> bool:
        """Whether a running job can take ``other`` (the same callbacks, in order)."""
        return self.best == other.best


@attrs.frozen
class Keep:
    """A ModelSaver keep policy: ``latest`` newest, for good the last save at or before
    each multiple of ``every_epochs`` epochs (0: no such rule), the ``best`` saves by
    val/loss (0: no such rule)."""

    latest: int = 2
    every_epochs: int = 0
    best: int = 0

    def toml(self) -> str:
        rules = [f"{{ latest = {self.latest} }}"]
        if self.every_epochs:
            rules.append(f'{{ every = "{self.every_epochs} epochs" }}')
        if self.best:
            rules.append(f'{{ best = {self.best}, monitor = "val/loss" }}')
        return rules[0] if len(rules) == 1 else f"{{ any = [{', '.join(rules)}] }}"


@attrs.frozen
class RunOptions:
    """The ``[run]`` table: ``epochs`` (8 steps each), the seed, sync or async saves;
    ``notice_port``: a local metadata server's port (0: none); ``checkpoint_dir``: an
    ``s3://`` URL (empty: ``RUN_DIR/checkpoints``) on the S3 server at ``endpoint``."""

    epochs: int = 4
    seed: int = 0
    mode: str = "async"
    notice_port: int = 0
    checkpoint_dir: str = ""
    endpoint: str = ""

    @property
    def end(self) -> int:
        return self.epochs * STEPS_PER_EPOCH

    def toml(self) -> str:
        lines = ["[run]", 'task = "jobs.lifecycle:make_task"', f"max_epochs = {self.epochs}",
                 f"seed = {self.seed}", f'checkpoint_mode = "{self.mode}"',
                 'mtbf = "1 min"', 'preempt_signals = ["SIGTERM", "SIGUSR1"]']
        if self.notice_port:
            lines.append(f'preempt_notice = "aws+http://127.0.0.1:{self.notice_port}"')
        if self.checkpoint_dir:
            lines.append(f'checkpoint_dir = "{self.checkpoint_dir}"')
            lines.append(f'storage_options = {{ client_kwargs = {{ endpoint_url = '
                         f'"{self.endpoint}" }} }}')
        return "\n".join(lines) + "\n"


def render(run: RunOptions, schedule: Schedule, keep: Keep) -> str:
    return run.toml() + "\n" + schedule.callbacks(keep.toml())
