"""Values that are not scalars: images, histograms and text, checked when they are put.

Each becomes a ``MediaRecord`` whose payload is plain host data (an image is a ``uint8``
``HWC`` tensor, a histogram its bins and counts, text a string), so the sinks never see
a value they cannot write and a checkpoint holds it as it is.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import torch

__all__ = ["Histogram", "MediaKind", "MediaRecord", "confusion_table", "media_path",
           "to_histogram", "to_image", "to_text"]

MediaKind = Literal["image", "histogram", "text"]
_EXT = {"image": "png", "histogram": "json", "text": "txt"}
_LAYOUTS = {2: ("HW",), 3: ("CHW", "HWC"), 4: ("NCHW", "NHWC")}


@attrs.frozen
class Histogram:
    """Bins and counts of a set of values: ``edges`` has one more entry than ``counts``."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    min: float
    max: float
    num: int
    sum: float
    sum_squares: float

    def to_dict(self) -> dict[str, Any]:
        """The histogram's JSON (what ``media/<name>/step-*.json`` holds)."""
        return {"edges": list(self.edges), "counts": list(self.counts), "min": self.min,
                "max": self.max, "num": self.num, "sum": self.sum,
                "sum_squares": self.sum_squares}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Histogram:
        """The inverse of ``to_dict``."""
        return cls(tuple(float(x) for x in d["edges"]), tuple(int(x) for x in d["counts"]),
                   float(d["min"]), float(d["max"]), int(d["num"]), float(d["sum"]),
                   float(d["sum_squares"]))


@attrs.frozen
class MediaRecord:
    """One image, histogram or text put at ``(step, epoch)``; ``path`` is where its file
    goes, relative to the run directory (``media/<name>/step-00000012.png``)."""

    kind: MediaKind
    name: str
    step: int
    epoch: int
    wall: float
    path: str
    payload: torch.Tensor | Histogram | str

    def to_dict(self) -> dict[str, Any]:
        """The ``events.jsonl`` line of this value (its file is written beside)."""
        return {"kind": "media", "type": self.kind, "name": self.name, "step": self.step,
                "epoch": self.epoch, "time": self.wall, "path": self.path}


def _as_tensor(name: str, value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if hasattr(value, "__array__") and hasattr(value, "dtype"):  # a numpy array
        try:  # a copy: a view with negative strides (``a[::-1]``) is fine too
            return torch.as_tensor(value.copy())
        except TypeError:
            raise TypeError(f"{what} {name!r} must hold numbers, got a numpy array of "
                            f"{value.dtype}") from None
    raise TypeError(f"{what} {name!r} must be a torch tensor or a numpy array, got "
                    f"{type(value).__name__}")


def to_image(name: str, value: Any, layout: str | None = None) -> torch.Tensor:
    """``value`` as a ``uint8`` ``HWC`` tensor (a batch becomes one grid).

    Args:
        name: the metric, for errors.
        value: a tensor or numpy array: ``uint8`` in [0, 255], ``bool``, or float in
            [0, 1]; 2-D ``HW``, 3-D, or a 4-D batch.
        layout: ``"HW"``, ``"CHW"``, ``"HWC"``, ``"NCHW"`` or ``"NHWC"``; by default a
            torch tensor is channels-first (``CHW``/``NCHW``, as torchvision) and a numpy
            array channels-last (``HWC``/``NHWC``, as tensorpack and PIL).

    Raises:
        TypeError, ValueError: naming the metric and what was expected.
    """
    is_torch = isinstance(value, torch.Tensor)
    t = _as_tensor(name, value, "image")
    if t.ndim not in _LAYOUTS:
        raise ValueError(f"image {name!r} must be 2-D (HW), 3-D (CHW or HWC) or a 4-D batch "
                         f"(NCHW or NHWC), got shape {tuple(t.shape)}")
    lay = layout if layout is not None else _LAYOUTS[t.ndim][0 if is_torch else -1]
    if lay not in _LAYOUTS[t.ndim]:
        raise ValueError(f"image {name!r} of shape {tuple(t.shape)} cannot have layout "
                         f"{lay!r}: expected one of {list(_LAYOUTS[t.ndim])}")
    t = {"HW": lambda x: x[None, :, :, None], "CHW": lambda x: x.permute(1, 2, 0)[None],
         "HWC": lambda x: x[None], "NCHW": lambda x: x.permute(0, 2, 3, 1),
         "NHWC": lambda x: x}[lay](t)
    n, h, w, c = t.shape
    if c not in (1, 3, 4):
        other = {"CHW": "HWC", "HWC": "CHW", "NCHW": "NHWC", "NHWC": "NCHW"}.get(lay)
        hint = f": channels-{'first' if lay.endswith('C') else 'last'}? pass layout={other!r}"
        raise ValueError(f"image {name!r} must have 1, 3 or 4 channels, got {c} in shape "
                         f"{tuple(value.shape)} read as {lay}" + (hint if other else ""))
    if n == 0 or h == 0 or w == 0:
        raise ValueError(f"image {name!r} is empty (shape {tuple(value.shape)})")
    return _grid(_to_uint8(name, t))


def _to_uint8(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if t.dtype == torch.bool:
        return t.to(torch.uint8) * 255
    if not t.is_floating_point():
        raise TypeError(f"image {name!r} must be uint8 (0..255) or float (0..1), got "
                        f"{str(t.dtype).removeprefix('torch.')}; a confusion matrix goes "
                        "to put_text")
    t = t.float()
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"image {name!r} has non-finite values")
    lo, hi = float(t.min()), float(t.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"float image {name!r} must have values in [0, 1], got "
                         f"[{lo:g}, {hi:g}]: divide by 255, or pass uint8")
    return (t * 255.0).round().to(torch.uint8)


def _grid(t: torch.Tensor) -> torch.Tensor:
    """A batch ``NHWC`` as one near-square ``HWC`` grid, row by row (black where empty)."""
    n, h, w, c = t.shape
    if n == 1:
        return t[0].contiguous()
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    out = torch.zeros(rows * h, cols * w, c, dtype=torch.uint8)
    for i in range(n):
        r, q = divmod(i, cols)
        out[r * h:(r + 1) * h, q * w:(q + 1) * w] = t[i]
    return out


def to_histogram(name: str, values: Any, bins: int = 30) -> Histogram:
    """``values`` (a tensor, numpy array or sequence of numbers) in ``bins`` equal bins
    from their min to their max.

    Raises:
        TypeError, ValueError: naming the metric, for no values, non-numbers or
            non-finite values, or ``bins`` < 1.
    """
    if not isinstance(bins, int) or isinstance(bins, bool) or bins < 1:
        raise ValueError(f"histogram {name!r}: bins must be an integer >= 1, got {bins!r}")
    if isinstance(values, list | tuple):
        try:
            t = torch.as_tensor(values, dtype=torch.float64)
        except (TypeError, ValueError):
            raise TypeError(f"histogram {name!r} must be numbers, got a "
                            f"{type(values).__name__} that holds others") from None
    else:
        t = _as_tensor(name, values, "histogram")
    if t.dtype == torch.bool or t.is_complex() or not (t.is_floating_point()
                                                       or t.dtype.is_signed
                                                       or t.dtype == torch.uint8):
        raise TypeError(f"histogram {name!r} must be real numbers, got "
                        f"{str(t.dtype).removeprefix('torch.')}")
    x = t.reshape(-1).double()
    if x.numel() == 0:
        raise ValueError(f"histogram {name!r} has no values")
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f"histogram {name!r} has {bad} non-finite values of {x.numel()}")
    lo, hi = float(x.min()), float(x.max())
    a, b = (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
    counts, edges = torch.histogram(x, bins=bins, range=(a, b))
    return Histogram(tuple(edges.tolist()), tuple(int(c) for c in counts.tolist()), lo, hi,
                     x.numel(), float(x.sum()), float((x * x).sum()))


def to_text(name: str, value: Any) -> str:
    """``value`` as text: a string as it is, a 2-D integer tensor or array (a confusion
    matrix) as ``confusion_table`` writes it.

    Raises:
        TypeError: naming the metric, for anything else.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, torch.Tensor) or (hasattr(value, "__array__")
                                           and hasattr(value, "dtype")):
        return confusion_table(value, name=name)
    raise TypeError(f"text {name!r} must be a str or a 2-D integer tensor (a confusion "
                    f"matrix), got {type(value).__name__}")


def confusion_table(matrix: Any, labels: Sequence[str] | None = None, *,
                    name: str = "confusion matrix") -> str:
    """A Markdown table of a confusion matrix: row ``i`` the true class ``i``, column ``j``
    the predicted class ``j`` (as torchmetrics and scikit-learn count them).

    Raises:
        TypeError, ValueError: for a matrix that is not 2-D integers, or ``labels`` that
            do not name each row and column.
    """
    t = _as_tensor(name, matrix, "text")
    if t.ndim != 2 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name!r}: a confusion matrix must be a 2-D integer tensor, got "
                        f"{str(t.dtype).removeprefix('torch.')} of shape {tuple(t.shape)}")
    rows, cols = t.shape
    names = [str(i) for i in range(max(rows, cols))] if labels is None else list(labels)
    if len(names) < max(rows, cols):
        raise ValueError(f"{name!r}: {len(names)} labels for a {rows}x{cols} matrix")
    head = "| true \\ predicted | " + " | ".join(names[:cols]) + " |"
    rule = "|---|" + "---:|" * cols
    body = ["| " + names[i] + " | " + " | ".join(str(int(v)) for v in t[i].tolist()) + " |"
            for i in range(rows)]
    return "\n".join([head, rule, *body]) + "\n"


_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def media_path(kind: MediaKind, name: str, step: int, repeat: int) -> str:
    """Where a value of ``name`` put at ``step`` goes, relative to the run directory:
    ``media/<name>/step-00000012.<ext>`` (``-<repeat>`` for a second value at one step).

    Each ``/``-separated part of the name stays a folder when it is a plain file name
    (letters, digits, ``.``, ``_``, ``-``; not ``.`` or ``..``); otherwise the name's
    unsafe characters become ``_`` and a short hash of the name keeps it apart from
    others, so nothing escapes ``media/`` and two names never share a folder.
    """
    parts = name.split("/")
    if all(_SAFE.fullmatch(p) and p not in (".", "..") and len(p) <= 100 for p in parts):
        folder = "/".join(parts)
    else:
        tag = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        clean = [re.sub(r"[^A-Za-z0-9._-]", "_", p).strip(".")[:100] for p in parts]
        folders = [p for p in clean[:-1] if p]
        folder = "/".join([*folders, f"{clean[-1] or 'metric'}-{tag}"])
    suffix = f"-{repeat}" if repeat else ""
    return f"media/{folder}/step-{step:08d}{suffix}.{_EXT[kind]}"
