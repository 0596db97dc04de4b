"""Simulated training: a run of known shape, jumping from one possible firing to the next.

``simclock`` holds the run's shape (``RunShape``) and its clock (``SimClock``);
``simulate`` runs a schedule on it (``simulate()``, ``Simulation``, ``next_firing``);
``ranks`` simulates several processes (``simulate_ranks``); ``metric_stream`` reads the
metric values that conditions and metric triggers see; ``files`` the checkpoint
files a run's retention rules leave after each save (``planned_files``). Nothing here imports torch.
"""

from schedtrain.schedule.firings import Firing as Firing
from schedtrain.schedule.firings import FiringLog as FiringLog
from schedtrain.simulation.files import SaveFiles as SaveFiles
from schedtrain.simulation.files import SaverFiles as SaverFiles
from schedtrain.simulation.files import planned_files as planned_files
from schedtrain.simulation.simclock import RunShape as RunShape
from schedtrain.simulation.simclock import SimClock as SimClock
from schedtrain.simulation.simulate import Simulation as Simulation
from schedtrain.simulation.simulate import next_firing as next_firing
from schedtrain.simulation.simulate import simulate as simulate

__all__ = ["Firing", "FiringLog", "RunShape", "SaveFiles", "SaverFiles", "SimClock",
           "Simulation", "next_firing", "planned_files", "simulate"]
