"""Callbacks say *what* to do; triggers say *when* (torch allowed here).

Built-ins live one family per module: ``saver`` (ModelSaver, MinSaver, MaxSaver),
``inference`` (InferenceRunner), ``hyperparam`` (ScheduledHyperParamSetter),
``stopping`` (EarlyStopping, TerminateOnNaN) and ``progress`` (ProgressBar).
"""

from schedtrain.callbacks.base import Callback as Callback
from schedtrain.callbacks.base import StepOutputs as StepOutputs

__all__ = ["Callback", "StepOutputs"]
