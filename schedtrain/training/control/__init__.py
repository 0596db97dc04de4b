"""Run control: what changes a run while it trains, from outside the loop.

``inbox.py`` holds the ``Inbox``, where requests from other threads and processes land (a
signal, a cloud's preemption notice with its deadline, a background save that ended) and
the loop's next due step that they lower; ``handle_signals`` and ``deadline_on_clock``
are there too. ``notice.py`` polls a cloud's metadata server for preemption notices.
The loop reads the inbox at its one comparison and its slow path only, so a quiet step
pays nothing for any of it (docs/architecture.md).
"""
