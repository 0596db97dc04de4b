"""The training loop that drives the clock and the trigger table (torch lives here)."""

from schedtrain.errors import RunDirError as RunDirError
from schedtrain.errors import RunEnded as RunEnded
from schedtrain.training.control.schedule_change import ScheduleChanged as ScheduleChanged
from schedtrain.training.data_position import seed_everything as seed_everything
from schedtrain.training.from_spec import Task as Task
from schedtrain.training.from_spec import train_from_spec as train_from_spec
from schedtrain.training.trainer import Trainer as Trainer

__all__ = ["RunDirError", "RunEnded", "ScheduleChanged", "Task", "Trainer", "seed_everything",
           "train_from_spec"]
