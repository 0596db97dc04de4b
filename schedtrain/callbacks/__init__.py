"""Callbacks say *what* to do; triggers say *when* (torch allowed here).

The ``Callback`` base and the built-ins, one family per module: ``saver`` (ModelSaver,
MinSaver, MaxSaver, TopKSaver), ``inference`` (InferenceRunner), ``hyperparam``
(ScheduledHyperParamSetter), ``stopping`` (EarlyStopping, TerminateOnNaN),
``progress`` (ProgressBar), ``printing`` (PrintProgress, PrintMetrics) and ``optim``
(LearningRateMonitor, LRScheduler, GradientAccumulationScheduler). All are importable from here.
"""

from schedtrain.callbacks.base import Callback as Callback
from schedtrain.callbacks.base import StepOutputs as StepOutputs
from schedtrain.callbacks.hyperparam import ScheduledHyperParamSetter as ScheduledHyperParamSetter
from schedtrain.callbacks.inference import InferenceRunner as InferenceRunner
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
from schedtrain.callbacks.stopping import EarlyStopping as EarlyStopping
from schedtrain.callbacks.stopping import TerminateOnNaN as TerminateOnNaN

__all__ = ["Callback", "EarlyStopping", "InferenceRunner", "MaxSaver", "MinSaver",
           "ModelSaver", "ProgressBar", "ScheduledHyperParamSetter", "StepOutputs",
           "TerminateOnNaN"]
__all__ += ["GradientAccumulationScheduler", "LRScheduler", "LearningRateMonitor",
            "PrintMetrics", "PrintProgress", "TopKSaver"]
