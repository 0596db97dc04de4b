"""``GPUUtilizationTracker`` (also ``DeviceStatsMonitor``): GPU and host figures as metrics.

GPU utilisation and memory come from NVML (``nvidia-ml-py``, the ``gpu`` extra) and
``torch.cuda``'s allocator; host CPU and RAM from ``psutil`` when installed, else from
the operating system (``/proc/meminfo``, this process's CPU time). Every optional
library is imported when the callback starts, and each missing one is said once in
the log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from schedtrain.callbacks.base import Callback
from schedtrain.logs import get_logger
from schedtrain.triggers import Trigger, every

__all__ = ["HOST_METRICS", "DeviceStatsMonitor", "GPUUtilizationTracker", "gpu_metrics"]

_log = get_logger("schedtrain.callbacks")
_GB = 1024**3

#: Host metrics, recorded with or without a GPU.
HOST_METRICS = ("host/cpu_percent", "host/ram_used_gb", "host/ram_percent")


def gpu_metrics(index: int) -> tuple[str, ...]:
    """The metrics of CUDA device ``index``."""
    p = f"device/gpu{index}"
    return (f"{p}/util", f"{p}/mem_used_gb", f"{p}/mem_total_gb", f"{p}/allocated_gb",
            f"{p}/reserved_gb", f"{p}/max_allocated_gb")


class GPUUtilizationTracker(Callback):
    """When fired (default: every 100 steps), record each visible GPU's utilisation and
    memory and the host's CPU and RAM use.

    Metrics (``i`` is the CUDA device index): ``device/gpu{i}/util`` (percent of the last
    sample period the GPU was busy, NVML), ``device/gpu{i}/mem_used_gb`` and
    ``mem_total_gb`` (NVML, all processes), ``allocated_gb``, ``reserved_gb`` and
    ``max_allocated_gb`` (this process, ``torch.cuda``); ``host/cpu_percent`` (all CPUs
    with psutil, else this process's share of them since the last firing),
    ``host/ram_used_gb`` and ``host/ram_percent``. Without a GPU it says so once and
    records the host figures.
    """

    may_stop_alone: ClassVar[bool] = False

    default_trigger: ClassVar[Trigger] = every("100 steps")

    def __init__(self) -> None:
        # Counting devices does not initialise CUDA; knowing them here lets the schedule
        # see every metric name before training starts.
        self._gpus = (list(range(torch.cuda.device_count())) if torch.cuda.is_available()
                      else [])
        self.produces = (*(m for i in self._gpus for m in gpu_metrics(i)), *HOST_METRICS)
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._psutil: Any = None
        self._cpu_mark = (time.perf_counter(), _process_cpu())

    def _setup(self) -> None:
        if not self._gpus:
            _log.info("device_stats", callback=self.name,
                      message="no GPU: recording host CPU and RAM only")
        else:
            self._nvml, self._handles = _nvml_handles(self._gpus, self.name)
        try:
            import psutil

            self._psutil = psutil
            psutil.cpu_percent(interval=None)  # the next call measures from here
        except ImportError:
            _log.info("device_stats", callback=self.name,
                      message="psutil is not installed: host/cpu_percent is this process's "
                              "share; pip install psutil for the whole host")
        self._cpu_mark = (time.perf_counter(), _process_cpu())

    def _trigger(self) -> None:
        put = self.metrics.put
        for i, handle in zip(self._gpus, self._handles or [None] * len(self._gpus),
                             strict=True):
            p = f"device/gpu{i}"
            if handle is not None:
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                put(f"{p}/util", float(util.gpu))
                put(f"{p}/mem_used_gb", mem.used / _GB)
                put(f"{p}/mem_total_gb", mem.total / _GB)
            put(f"{p}/allocated_gb", torch.cuda.memory_allocated(i) / _GB)
            put(f"{p}/reserved_gb", torch.cuda.memory_reserved(i) / _GB)
            put(f"{p}/max_allocated_gb", torch.cuda.max_memory_allocated(i) / _GB)
        for name, value in self.host_figures().items():
            put(name, value)

    def host_figures(self) -> dict[str, float]:
        """``host/cpu_percent``, ``host/ram_used_gb`` and ``host/ram_percent`` (those the
        system can tell)."""
        out: dict[str, float] = {}
        if self._psutil is not None:
            vm = self._psutil.virtual_memory()
            out["host/cpu_percent"] = float(self._psutil.cpu_percent(interval=None))
            out["host/ram_used_gb"] = (vm.total - vm.available) / _GB
            out["host/ram_percent"] = float(vm.percent)
            return out
        wall, cpu = time.perf_counter(), _process_cpu()
        then_wall, then_cpu = self._cpu_mark
        self._cpu_mark = (wall, cpu)
        if wall > then_wall:
            out["host/cpu_percent"] = 100 * (cpu - then_cpu) / (wall - then_wall) / (
                os.cpu_count() or 1)
        ram = _meminfo()
        if ram is not None:
            total, available = ram
            out["host/ram_used_gb"] = (total - available) / _GB
            out["host/ram_percent"] = 100 * (total - available) / total
        return out

    def _after_train(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml, self._handles = None, []

    def state_dict(self) -> dict[str, Any]:
        return {}


#: The same callback under Lightning's name.
DeviceStatsMonitor = GPUUtilizationTracker


def _nvml_handles(gpus: list[int], name: str | None) -> tuple[Any, list[Any]]:
    """NVML and a handle per CUDA device (matched by PCI bus, so ``CUDA_VISIBLE_DEVICES``
    is respected), or ``(None, [])`` with a log line when NVML cannot be used."""
    try:
        import pynvml
    except ImportError:
        _log.info("device_stats", callback=name, message="nvidia-ml-py is not installed: "
                  "GPU utilisation is not recorded, only torch.cuda memory; "
                  "pip install 'schedtrain[gpu]'")
        return None, []
    try:
        pynvml.nvmlInit()
        handles = [_handle(pynvml, i) for i in gpus]
    except Exception as exc:
        _log.info("device_stats", callback=name,
                  message=f"NVML is not usable ({exc}): only torch.cuda memory is recorded")
        return None, []
    return pynvml, handles


def _handle(pynvml: Any, index: int) -> Any:
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = (f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:"
           f"{getattr(props, 'pci_device_id', 0):02x}.0")
    return pynvml.nvmlDeviceGetHandleByPciBusId(pci)


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _meminfo() -> tuple[int, int] | None:
    """Total and available RAM in bytes from ``/proc/meminfo`` (Linux), else ``None``."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    fields = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        return None
    return fields["MemTotal"], fields["MemAvailable"]
