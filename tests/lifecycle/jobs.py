"""The lifecycle's own callback: ``Digest`` writes the digest of the model's weights (every
tensor's bytes, by name) to ``RUN_DIR/weights.digest`` at train_end, so a finished run's
final weights are compared exactly with an uninterrupted run's."""

from __future__ import annotations

import hashlib

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
