"""A cloud preemption notice on two ranks (torchrun, gloo): one agreed step, one checkpoint."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from notice_server import NoticeServer, wait_for_file
from test_distributed import rank_firings, torchrun, write_spec

from schedtrain.training.control.notice import POLL_ENV

#: the poll interval for tests (the default is 5 s)
FAST_POLL = "0.02"


def test_a_notice_preempts_both_ranks_at_one_step(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks (torchrun, gloo): the machine's first process polls; the notice stops
    both at one agreed step with one preemption checkpoint, and both decided alike (its
    deadline is not given to `before_deadline` on several processes)."""
    monkeypatch.setenv(POLL_ENV, FAST_POLL)
    with NoticeServer() as server:
        spec = write_spec(tmp_path, """
[callbacks.slow]
type = "jobs.ddp:Sleep"
seconds = 0.05
trigger = { every = "1 step" }

[callbacks.last]
type = "jobs.ddp:Sleep"
seconds = 0
trigger = { before_deadline = "60 s" }

[callbacks.dump]
type = "jobs.ddp:DumpFirings"
trigger = { on = "preempt" }
""", epochs=200)  # ends by the notice long before
        spec.write_text(spec.read_text().replace(
            "seed = 1\n", f'seed = 1\npreempt_notice = "{server.url("gce")}"\n'))
        run_dir = tmp_path / "run"
        served = threading.Thread(target=lambda: (wait_for_file(run_dir / "events.jsonl"),
                                                  server.serve_notice()), daemon=True)
        served.start()
        result = torchrun(spec, run_dir, timeout=300)
    assert "notice: GCE instance/preempted, deadline" in result.stderr  # the chief's thread
    # One line, from the chief, naming the notice: a rank without it waits for the rank
    # that has it to post (distributed.agreement), as for any signal on one rank.
    assert result.stderr.count("preempted by ") == 1, result.stderr[-3000:]
    assert result.stderr.count("preempted by the GCE preemption notice") == 1
    assert "exitcode  : 75" in result.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "preempted"
    preempted = [p for p in (run_dir / "checkpoints").glob("*.pt")
                 if torch.load(p, weights_only=True)["phase"] == "preempt"]
    assert len(preempted) == 1
    zero, one = rank_firings(tmp_path, 0), rank_firings(tmp_path, 1)
    assert zero == one and not any(f[0] == "last" for f in zero)
