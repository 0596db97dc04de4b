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
"""

from schedtrain.callbacks.averages import MovingAverageSummary as MovingAverageSummary
from schedtrain.callbacks.base import BatchInfo as BatchInfo
from schedtrain.callbacks.base import Callback as Callback
from schedtrain.callbacks.base import StepOutputs as StepOutputs
from schedtrain.callbacks.devicestats import DeviceStatsMonitor as DeviceStatsMonitor
from schedtrain.callbacks.devicestats import GPUUtilizationTracker as GPUUtilizationTracker
from schedtrain.callbacks.human import HumanHyperParamSetter as HumanHyperParamSetter
from schedtrain.callbacks.hyperparam import ScheduledHyperParamSetter as ScheduledHyperParamSetter
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
