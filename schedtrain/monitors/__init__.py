"""Where values and firings go: the metric store and its writers (torch allowed here)."""

from schedtrain.monitors.console import ConsolePrinter as ConsolePrinter
from schedtrain.monitors.jsonl import JsonlWriter as JsonlWriter
from schedtrain.monitors.media import Histogram as Histogram
from schedtrain.monitors.media import MediaRecord as MediaRecord
from schedtrain.monitors.media import confusion_table as confusion_table
from schedtrain.monitors.store import MetricStore as MetricStore
from schedtrain.monitors.store import Record as Record
from schedtrain.monitors.store import Sink as Sink
from schedtrain.monitors.tensorboard import TensorBoardWriter as TensorBoardWriter

__all__ = ["ConsolePrinter", "Histogram", "JsonlWriter", "MediaRecord", "MetricStore",
           "Record", "Sink", "TensorBoardWriter", "confusion_table"]
