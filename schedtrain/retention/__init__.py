"""Which checkpoints a saver keeps: retention rules in the schedule's vocabulary.

A policy is a rule or ``AnyOf`` rules; a checkpoint is kept if any rule keeps it, and the
newest finite one is always kept besides (a diverged run has a good one to go back to).
``Latest(3)`` keeps the newest three (temporary: each is deleted once three newer ones
exist); ``Every(Time.parse("10000 steps"))`` keeps the first checkpoint at or after each
multiple of the period, on any counter (``"1 h"`` is a training-time grid), for good
(permanent), and on epochs the last one at or before each multiple (the one that ends
epoch 5, 10...); ``Best(2, "val/loss", "min")`` keeps the two best by a metric's value at
the save. The rules are pure functions of the saves' records, so a simulated run and a
real run keep the same files, and a resumed run, given the records back, keeps the same.
Torch-free: ``schedtrain plan`` evaluates it.
"""

from schedtrain.retention.keep import SaverKind as SaverKind
from schedtrain.retention.keep import parse_keep as parse_keep
from schedtrain.retention.keep import policy_problems as policy_problems
from schedtrain.retention.keep import saver_keep as saver_keep
from schedtrain.retention.keep import saver_keep_problems as saver_keep_problems
from schedtrain.retention.rules import AnyOf as AnyOf
from schedtrain.retention.rules import Best as Best
from schedtrain.retention.rules import Every as Every
from schedtrain.retention.rules import Latest as Latest
from schedtrain.retention.rules import Policy as Policy
from schedtrain.retention.rules import Saved as Saved
from schedtrain.retention.rules import retained as retained
from schedtrain.retention.rules import saved_at as saved_at
from schedtrain.retention.rules import saved_row as saved_row
from schedtrain.retention.rules import spell as spell

__all__ = [
    "AnyOf", "Best", "Every", "Latest", "Policy", "Saved", "SaverKind", "parse_keep",
    "policy_problems", "retained", "saved_at", "saved_row", "saver_keep",
    "saver_keep_problems", "spell",
]  # fmt: skip
