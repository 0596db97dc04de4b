"""Callbacks say *what* to do; triggers say *when* (torch allowed here).

The ``Callback`` base and the built-ins, one family per module: ``saver`` (ModelSaver,
MinSaver, MaxSaver, TopKSaver), ``inference`` (InferenceRunner) and ``inferencers``
(ScalarStats, ClassificationError, TorchMetric), ``hyperparam``
(ScheduledHyperParamSetter), ``human`` (HumanHyperParamSetter), ``optim``
(LearningRateMonitor, LRScheduler, GradientAccumulationScheduler), ``stopping``
(EarlyStopping, TerminateOnNaN), ``progress`` (ProgressBar), ``printing`` (PrintProgress,
PrintMetrics), ``averages`` (MovingAverageSummary), ``devicestats``
(GPUUtilizationTracker, alias DeviceStatsMonitor), ``sendstat`` (SendStat) and ``shell``
(InjectShell). All are importable from here, and so are tensorpack's scheduling wrappers
(``PeriodicTrigger``, ``PeriodicCallback``, ``EnableCallbackIf``, from
``schedtrain.schedule``), where tensorpack users look for them.

The names load on first use (PEP 562), so importing one module of this package (the
trainer imports ``autosave``) does not import every family and what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from schedtrain.lazy import LazyNames

#: Public name -> the module that defines it.
_EXPORTS: Final = {
    "MovingAverageSummary": "schedtrain.callbacks.averages",
    "BatchInfo": "schedtrain.callbacks.base",
    "Callback": "schedtrain.callbacks.base",
    "StepOutputs": "schedtrain.callbacks.base",
    "DeviceStatsMonitor": "schedtrain.callbacks.devicestats",
    "GPUUtilizationTracker": "schedtrain.callbacks.devicestats",
    "HumanHyperParamSetter": "schedtrain.callbacks.human",
    "ScheduledHyperParamSetter": "schedtrain.callbacks.hyperparam",
    "InferenceRunner": "schedtrain.callbacks.inference",
    "ClassificationError": "schedtrain.callbacks.inferencers",
    "Inferencer": "schedtrain.callbacks.inferencers",
    "ScalarStats": "schedtrain.callbacks.inferencers",
    "TorchMetric": "schedtrain.callbacks.inferencers",
    "GradientAccumulationScheduler": "schedtrain.callbacks.optim",
    "LearningRateMonitor": "schedtrain.callbacks.optim",
    "LRScheduler": "schedtrain.callbacks.optim",
    "PrintMetrics": "schedtrain.callbacks.printing",
    "PrintProgress": "schedtrain.callbacks.printing",
    "ProgressBar": "schedtrain.callbacks.progress",
    "MaxSaver": "schedtrain.callbacks.saver",
    "MinSaver": "schedtrain.callbacks.saver",
    "ModelSaver": "schedtrain.callbacks.saver",
    "TopKSaver": "schedtrain.callbacks.saver",
    "SendStat": "schedtrain.callbacks.sendstat",
    "InjectShell": "schedtrain.callbacks.shell",
    "EarlyStopping": "schedtrain.callbacks.stopping",
    "TerminateOnNaN": "schedtrain.callbacks.stopping",
    "PortingWarning": "schedtrain.errors",
    "EnableCallbackIf": "schedtrain.schedule.tensorpack",
    "PeriodicCallback": "schedtrain.schedule.tensorpack",
    "PeriodicTrigger": "schedtrain.schedule.tensorpack",
}  # fmt: skip

__all__ = ["BatchInfo", "Callback", "ClassificationError", "DeviceStatsMonitor", "EarlyStopping",
           "EnableCallbackIf",
           "GPUUtilizationTracker", "GradientAccumulationScheduler", "HumanHyperParamSetter",
           "InferenceRunner", "Inferencer", "InjectShell", "LRScheduler",
           "LearningRateMonitor", "MaxSaver", "MinSaver", "ModelSaver",
           "MovingAverageSummary", "PeriodicCallback", "PeriodicTrigger", "PortingWarning",
           "PrintMetrics",
           "PrintProgress", "ProgressBar",
           "ScalarStats", "ScheduledHyperParamSetter", "SendStat", "StepOutputs",
           "TerminateOnNaN", "TopKSaver", "TorchMetric"]


_NAMES = LazyNames(__name__, globals(), _EXPORTS)
__getattr__ = _NAMES.load
__dir__ = _NAMES.names


if TYPE_CHECKING:  # what static tools see; at run time the names load on first use
    from schedtrain.callbacks.averages import MovingAverageSummary as MovingAverageSummary
    from schedtrain.callbacks.base import BatchInfo as BatchInfo
    from schedtrain.callbacks.base import Callback as Callback
    from schedtrain.callbacks.base import StepOutputs as StepOutputs
    from schedtrain.callbacks.devicestats import DeviceStatsMonitor as DeviceStatsMonitor
    from schedtrain.callbacks.devicestats import GPUUtilizationTracker as GPUUtilizationTracker
    from schedtrain.callbacks.human import HumanHyperParamSetter as HumanHyperParamSetter
    from schedtrain.callbacks.hyperparam import (
        ScheduledHyperParamSetter as ScheduledHyperParamSetter,
    )
    from schedtrain.callbacks.inference import InferenceRunner as InferenceRunner
    from schedtrain.callbacks.inferencers import ClassificationError as ClassificationError
    from schedtrain.callbacks.inferencers import Inferencer as Inferencer
    from schedtrain.callbacks.inferencers import ScalarStats as ScalarStats
    from schedtrain.callbacks.inferencers import TorchMetric as TorchMetric
    from schedtrain.callbacks.optim import (
        GradientAccumulationScheduler as GradientAccumulationScheduler,
    )
    from schedtrain.callbacks.optim import LearningRateMonitor as LearningRateMonitor
    from schedtrain.callbacks.optim import LRScheduler as LRScheduler
    from schedtrain.callbacks.printing import PrintMetrics as PrintMetrics
    from schedtrain.callbacks.printing import PrintProgress as PrintProgress
    from schedtrain.callbacks.progress import ProgressBar as ProgressBar
    from schedtrain.callbacks.saver import MaxSaver as MaxSaver
    from schedtrain.callbacks.saver import MinSaver as MinSaver
    from schedtrain.callbacks.saver import ModelSaver as ModelSaver
    from schedtrain.callbacks.saver import TopKSaver as TopKSaver
    from schedtrain.callbacks.sendstat import SendStat as SendStat
    from schedtrain.callbacks.shell import InjectShell as InjectShell
    from schedtrain.callbacks.stopping import EarlyStopping as EarlyStopping
    from schedtrain.callbacks.stopping import TerminateOnNaN as TerminateOnNaN
    from schedtrain.errors import PortingWarning as PortingWarning
    from schedtrain.schedule.tensorpack import EnableCallbackIf as EnableCallbackIf
    from schedtrain.schedule.tensorpack import PeriodicCallback as PeriodicCallback
    from schedtrain.schedule.tensorpack import PeriodicTrigger as PeriodicTrigger
