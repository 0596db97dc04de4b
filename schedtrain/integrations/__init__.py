"""The schedule in the loops people already use: Lightning, the Hugging Face ``Trainer``,
Ignite, and a loop of your own (docs/integrations.md).

One module per host, each imported only when you name it, so ``import
schedtrain.integrations`` imports no host (nor torch)::

    from schedtrain.integrations.lightning import ScheduleCallback      # lightning
    from schedtrain.integrations.transformers import ScheduleCallback   # transformers
    from schedtrain.integrations.ignite import attach_schedule, trigger_event  # ignite
    from schedtrain.integrations import ScheduleDriver                  # your own loop
    from schedtrain.integrations.hosted import CallbackDriver           # ... with Callbacks

Each host also runs schedtrain ``Callback`` objects (``hosted.py``), seeing the host
through a ``HostContext`` (``context.py``).
"""

from __future__ import annotations

from schedtrain.integrations.driver import LatestValues as LatestValues
from schedtrain.integrations.driver import ScheduleDriver as ScheduleDriver

__all__ = ["LatestValues", "ScheduleDriver"]
