"""Run control: what changes a run while it trains, from outside the loop.

``RunControl`` (``run_control.py``) is its one owner: the loop, the lifecycle, the
agreement between ranks and a host's driver talk to it and to nothing else here. It holds
the ``Inbox`` (``inbox.py``), where requests from other threads and processes land (a
signal, a cloud's preemption notice with its deadline, a background save that ended)
with the loop's next due step that they lower; the notice poller (``notice.py``); live
retime (``retime.py``); the schedule change at resume (``schedule_change.py``); and the
``RunJournal`` (``journal.py``), what a resumed run replays besides its checkpoint. The
loop reads the inbox at its one comparison and its slow path only, so a quiet step pays
nothing for any of it (docs/architecture.md, "Run control").
"""

from schedtrain.training.control.journal import RunJournal as RunJournal
from schedtrain.training.control.run_control import RunControl as RunControl

__all__ = ["RunControl", "RunJournal"]
