"""The lifecycle's own callbacks: ``Digest`` writes the digest of the model's weights (every
tensor's bytes, by name) to ``RUN_DIR/weights.digest`` at train_end, so a finished run's
final weights are compared exactly with an uninterrupted run's; ``Pace`` slows a job down."""

from __future__ import annotations

import hashlib
import time

from schedtrain.callbacks import Callback

DIGEST_FILE = "weights.digest"


class Digest(Callback):
    def _trigger(self) -> None:
        run_dir = self.trainer.run_dir
        if run_dir is None:
            return
        h = hashlib.sha256()
        for key, value in sorted(self.trainer.model.state_dict().items()):
            h.update(key.encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
        (run_dir / DIGEST_FILE).write_text(h.hexdigest() + "\n")


class Pace(Callback):
    """Sleeps a while at each firing: a job on several processes, killed from outside
    once a checkpoint lands, is still running then."""

    def _trigger(self) -> None:
        time.sleep(0.05)
