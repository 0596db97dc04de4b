"""Callbacks say *what* to do; triggers say *when* (torch allowed here).

The ``Callback`` base and the built-ins, one family per module: ``saver`` (ModelSaver,
MinSaver, MaxSaver), ``inference`` (InferenceRunner), ``hyperparam``
(ScheduledHyperParamSetter), ``stopping`` (EarlyStopping, TerminateOnNaN) and
``progress`` (ProgressBar); the rest of tensorpack's ResNet list: ``inferencers``
(ScalarStats, ClassificationError, TorchMetric for InferenceRunner), ``human``
(HumanHyperParamSetter), ``sendstat`` (SendStat), ``devicestats``
(GPUUtilizationTracker, alias DeviceStatsMonitor), ``shell`` (InjectShell) and
``averages`` (MovingAverageSummary). All are importable from here.
"""

from schedtrain.callbacks.averages import MovingAverageSummary as MovingAverageSummary
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
from schedtrain.callbacks.progress import ProgressBar as ProgressBar
from schedtrain.callbacks.saver import MaxSaver as MaxSaver
from schedtrain.callbacks.saver import MinSaver as MinSaver
from schedtrain.callbacks.saver import ModelSaver as ModelSaver
from schedtrain.callbacks.sendstat import SendStat as SendStat
from schedtrain.callbacks.shell import InjectShell as InjectShell
from schedtrain.callbacks.stopping import EarlyStopping as EarlyStopping
from schedtrain.callbacks.stopping import TerminateOnNaN as TerminateOnNaN

__all__ = ["Callback", "EarlyStopping", "InferenceRunner", "MaxSaver", "MinSaver",
           "ModelSaver", "ProgressBar", "ScheduledHyperParamSetter", "StepOutputs",
           "TerminateOnNaN"]
__all__ += ["ClassificationError", "DeviceStatsMonitor", "GPUUtilizationTracker",
            "HumanHyperParamSetter", "Inferencer", "InjectShell", "MovingAverageSummary",
            "ScalarStats", "SendStat", "TorchMetric"]
