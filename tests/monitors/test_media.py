"""Values that are not scalars: ``put_image``, ``put_histogram``, ``put_text`` reach the
sinks that show them (files under ``RUN_DIR/media/`` named by ``events.jsonl``,
TensorBoard) and never the scalar history that triggers and conditions read."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from training_helpers import UnevenData, tiny_model

from schedtrain import Schedule, every, on, when
from schedtrain.callbacks import Callback, ModelSaver
from schedtrain.monitors.cadence import Every
from schedtrain.monitors.jsonl import JsonlWriter
from schedtrain.monitors.media import confusion_table, media_path, to_histogram, to_image
from schedtrain.monitors.png import encode_png
from schedtrain.monitors.store import MetricStore
from schedtrain.time import Timestamp
from schedtrain.training import Trainer

mse = torch.nn.functional.mse_loss


def read_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit, non-interlaced PNG (checking each chunk's CRC) into ``HWC``."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and interlace == 0
    c = {0: 1, 4: 2, 2: 3, 6: 4}[colour]
    raw = zlib.decompress(idat)
    rows = [raw[i * (w * c + 1):(i + 1) * (w * c + 1)] for i in range(h)]
    assert all(r[0] == 0 for r in rows)  # filter "none"
    return np.frombuffer(b"".join(r[1:] for r in rows), np.uint8).reshape(h, w, c)


def _store(tmp: Path, ts: Timestamp | None = None) -> MetricStore:
    at = ts or Timestamp(step=12, epoch=1)
    return MetricStore(lambda: at, [JsonlWriter(tmp / "events.jsonl")])


def _lines(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp / "events.jsonl").read_text().splitlines()]


class TestPng:
    """``encode_png`` writes files a PNG reader decodes to the same pixels."""

    @settings(max_examples=40, deadline=None)
    @given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9),
                                          st.sampled_from([1, 2, 3, 4]))))
    def test_round_trip(self, pixels: np.ndarray) -> None:
        """Any size and 1 to 4 channels decode back to the same bytes."""
        h, w, c = pixels.shape
        assert np.array_equal(read_png(encode_png(pixels.tobytes(), h, w, c)), pixels)

    def test_pillow_reads_it(self) -> None:
        """Pillow (when installed) opens the file as RGB of the right size and pixels."""
        image_mod = pytest.importorskip("PIL.Image")
        import io

        pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
        img = image_mod.open(io.BytesIO(encode_png(pixels.tobytes(), 2, 3, 3)))
        assert (img.size, img.mode) == ((3, 2), "RGB")
        assert np.array_equal(np.asarray(img), pixels)


class TestToImage:
    """``to_image`` accepts the images users have and returns ``uint8`` ``HWC``."""

    @settings(max_examples=60, deadline=None)
    @given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 6), st.integers(1, 6),
                                          st.sampled_from([1, 3, 4]))),
           st.sampled_from(["HWC", "CHW"]), st.booleans())
    def test_layouts(self, hwc: np.ndarray, layout: str, as_torch: bool) -> None:
        """The same pixels given in either layout, as a tensor or an array, with the
        layout named, come back as the same ``HWC`` image."""
        given_ = hwc if layout == "HWC" else np.ascontiguousarray(hwc.transpose(2, 0, 1))
        value = torch.from_numpy(given_) if as_torch else given_
        assert np.array_equal(to_image("x", value, layout).numpy(), hwc)

    def test_defaults_follow_each_library(self) -> None:
        """A torch tensor is CHW (torchvision), a numpy array HWC (PIL, tensorpack)."""
        chw = torch.randint(0, 255, (3, 4, 5), dtype=torch.uint8)
        assert to_image("x", chw).shape == (4, 5, 3)
        assert to_image("x", chw.permute(1, 2, 0).numpy()).shape == (4, 5, 3)

    def test_float_in_unit_range(self) -> None:
        """Floats in [0, 1] become round(x * 255); a 2-D image is one grey channel."""
        img = to_image("x", torch.tensor([[0.0, 0.5], [1.0, 0.2]]))
        assert img.squeeze(-1).tolist() == [[0, 128], [255, 51]]

    def test_batch_is_a_grid(self) -> None:
        """tensorpack's NHWC batch of 5 becomes a 3-column grid, image i at row i // 3,
        column i % 3, black where no image is."""
        batch = np.stack([np.full((2, 3, 1), i + 1, np.uint8) for i in range(5)])
        grid = to_image("x", batch).numpy()
        assert grid.shape == (4, 9, 1)
        for i in range(5):
            r, c = divmod(i, 3)
            assert (grid[r * 2:(r + 1) * 2, c * 3:(c + 1) * 3] == i + 1).all()
        assert (grid[2:, 6:] == 0).all()

    @pytest.mark.parametrize(("value", "found"), [
        (torch.zeros(2, 4, 4), "1, 3 or 4 channels, got 2 in shape (2, 4, 4) read as CHW"),
        (torch.zeros(5, 5, 3), "channels-last? pass layout='HWC'"),
        (np.zeros((4, 4, 2)), "got 2 in shape (4, 4, 2) read as HWC"),
        (torch.full((3, 2, 2), 255.0), "values in [0, 1], got [255, 255]: divide by 255"),
        (torch.zeros(3, 2, 2, dtype=torch.int64), "uint8 (0..255) or float (0..1), got int64"),
        (torch.zeros(1, 1, 1, 1, 1), "2-D (HW), 3-D (CHW or HWC) or a 4-D batch"),
        ([[0, 1]], "a torch tensor or a numpy array, got list"),
        (torch.zeros(3, 0, 2), "is empty"),
        (torch.tensor([[float("nan")]]), "non-finite"),
    ])
    def test_bad_images_name_the_metric(self, value: Any, found: str) -> None:
        """A bad image is refused when put, naming the metric and what was expected."""
        store = MetricStore()
        with pytest.raises((TypeError, ValueError)) as info:
            store.put_image("val/samples", value)
        assert "image 'val/samples'" in str(info.value)
        assert found in str(info.value)

    def test_numpy_views_and_non_numbers(self) -> None:
        """A reversed numpy view is an image like any other; an array of strings is
        refused, naming the metric and the array's dtype."""
        hwc = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
        assert np.array_equal(to_image("x", hwc[::-1]).numpy(), hwc[::-1])
        with pytest.raises(TypeError, match="image 'x' must hold numbers, got a numpy array"):
            to_image("x", np.array([["a", "b"]]))

    def test_layout_must_fit_the_shape(self) -> None:
        """A layout that does not fit the array's dimensions is named with the choices."""
        with pytest.raises(ValueError, match=r"cannot have layout 'NHWC'.*\['CHW', 'HWC'\]"):
            to_image("x", torch.zeros(3, 2, 2), "NHWC")


class TestHistogram:
    """``put_histogram`` keeps bins and counts, computed when put."""

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.integers(1, 12))
    def test_counts_every_value_once(self, values: list[float], bins: int) -> None:
        """Counts add up to the values, edges span min..max in ``bins`` bins, and the
        summary (min, max, count, sum) is the values'."""
        h = to_histogram("w", values, bins)
        assert sum(h.counts) == h.num == len(values)
        assert len(h.edges) == bins + 1 and len(h.counts) == bins
        assert (h.min, h.max) == (min(values), max(values))
        assert h.edges[0] <= h.min and h.edges[-1] >= h.max
        assert h.sum == pytest.approx(sum(values), rel=1e-9, abs=1e-6)

    @pytest.mark.parametrize(("values", "found"), [
        ([], "has no values"),
        (torch.tensor([1.0, float("inf"), float("nan")]), "2 non-finite values of 3"),
        (torch.tensor([True]), "real numbers, got bool"),
        (["a"], "must be numbers"),
        ("abc", "a torch tensor or a numpy array, got str"),
    ])
    def test_bad_values_name_the_metric(self, values: Any, found: str) -> None:
        """Bad values are refused when put, naming the histogram."""
        with pytest.raises((TypeError, ValueError)) as info:
            MetricStore().put_histogram("grad/w", values)
        assert "histogram 'grad/w'" in str(info.value) and found in str(info.value)

    def test_written_as_json(self, tmp_path: Path) -> None:
        """The file holds the edges, counts and summary; the line names the file."""
        store = _store(tmp_path)
        store.put_histogram("w", torch.tensor([0.0, 1.0, 1.0, 3.0]), bins=3)
        store.flush()
        line = _lines(tmp_path)[0]
        assert line["kind"] == "media" and line["type"] == "histogram"
        data = json.loads((tmp_path / line["path"]).read_text())
        assert (data["edges"], data["counts"], data["num"]) == ([0.0, 1.0, 2.0, 3.0],
                                                                [1, 2, 1], 4)


class TestText:
    """``put_text`` takes a string or a confusion matrix."""

    def test_confusion_matrix_is_a_markdown_table(self, tmp_path: Path) -> None:
        """pytorch-accelerated's confusion matrix (a 2-D integer tensor) is written as a
        table: rows are the true class, columns the predicted one."""
        store = _store(tmp_path)
        store.put_text("val/confusion", torch.tensor([[5, 1], [2, 7]]))
        store.flush()
        text = (tmp_path / _lines(tmp_path)[0]["path"]).read_text()
        assert text.splitlines() == ["| true \\ predicted | 0 | 1 |", "|---|---:|---:|",
                                     "| 0 | 5 | 1 |", "| 1 | 2 | 7 |"]

    def test_labels(self) -> None:
        """``confusion_table`` names the classes; too few labels are refused."""
        assert "| cat | 1 | 0 |" in confusion_table(np.eye(2, dtype=np.int64), ["cat", "dog"])
        with pytest.raises(ValueError, match="1 labels for a 2x2 matrix"):
            confusion_table(np.eye(2, dtype=np.int64), ["cat"])

    def test_not_text(self) -> None:
        """A float matrix or another object is refused, naming the metric."""
        with pytest.raises(TypeError, match=r"'cm'.*2-D integer tensor, got float32"):
            MetricStore().put_text("cm", torch.zeros(2, 2))
        with pytest.raises(TypeError, match="text 'note' must be a str"):
            MetricStore().put_text("note", 3)


class TestScalarsStayScalars:
    """Media never enter the history triggers and conditions read."""

    def test_latest_and_history_refuse_a_media_name(self) -> None:
        """Reading an image as a scalar is a clear error, not a silent "missing"."""
        store = MetricStore()
        store.put_image("samples", torch.zeros(1, 2, 2))
        assert "samples" not in store and store.names() == []
        with pytest.raises(TypeError, match=r"'samples' is an image \(put_image\): "
                                            "conditions, metric triggers"):
            store.latest("samples")
        with pytest.raises(TypeError, match="read scalars only"):
            store.history("samples")
        assert store.latest("other") is None

    def test_one_name_one_kind(self) -> None:
        """A name keeps the kind it was first put as."""
        store = MetricStore()
        store.put("loss", 1.0)
        store.put_histogram("w", [1.0])
        with pytest.raises(ValueError, match="'loss' has scalar values"):
            store.put_image("loss", torch.zeros(1, 2, 2))
        with pytest.raises(ValueError, match=r"'w' is a histogram \(put_histogram\); "
                                             r"an image \(put_image\) needs another name"):
            store.put_image("w", torch.zeros(1, 2, 2))
        with pytest.raises(ValueError, match=r"'w' is a histogram.*a scalar needs another"):
            store.put("w", 1.0)

    def test_condition_on_an_image_metric(self) -> None:
        """A trigger condition naming an image metric stops the run with a clear error."""

        class Samples(Callback):
            produces = ("val/samples",)

            def _trigger(self) -> None:
                self.metrics.put_image("val/samples", torch.zeros(1, 2, 2))

        class Report(Callback):
            def _trigger(self) -> None:
                return None

        model, opt = tiny_model()
        sched = Schedule({"samples": every("1 step"),
                          "report": every("1 step") & when("val/samples > 0")})
        trainer = Trainer(model, opt, UnevenData([2]), mse, schedule=sched,
                          bindings={"samples": Samples(), "report": Report()},
                          max_epochs=1, handle_signals=False)
        with pytest.raises(TypeError, match="'val/samples' is an image"):
            trainer.fit()


class TestFiles:
    """Files go under ``media/``, safely named, one per value, each named by a line."""

    @settings(max_examples=200, deadline=None)
    @given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30),
           st.integers(0, 10**8), st.integers(0, 3))
    def test_names_stay_in_media_and_apart(self, a: str, b: str, step: int,
                                           repeat: int) -> None:
        """Whatever the name ("..", "/", spaces, any unicode), its file is inside
        ``media/``, and two names never share a folder."""
        base = Path("/run").resolve()
        path = media_path("image", a, step, repeat)
        assert (base / path).resolve().is_relative_to(base / "media")
        assert ".." not in Path(path).parts and "" not in path.split("/")
        if a != b:
            assert Path(path).parent != Path(media_path("image", b, step, repeat)).parent

    def test_events_line_and_file(self, tmp_path: Path) -> None:
        """A line of kind "media" names the file; a second value at one step gets its own
        file; scalars and media keep the order they were put in; no temporary file stays."""
        store = _store(tmp_path)
        img = torch.randint(0, 255, (3, 4, 5), dtype=torch.uint8)
        store.put("a", 1.0)
        store.put_image("val/samples", img)
        store.put("b", 2.0)
        store.put_image("val/samples", img)
        store.put_text("note", "hello")
        store.flush()
        lines = _lines(tmp_path)
        assert [(x["kind"], x["name"]) for x in lines] == [
            ("scalar", "a"), ("media", "val/samples"), ("scalar", "b"),
            ("media", "val/samples"), ("media", "note")]
        assert {k: lines[1][k] for k in ("type", "step", "epoch", "path")} == {
            "type": "image", "step": 12, "epoch": 1,
            "path": "media/val/samples/step-00000012.png"}
        assert lines[3]["path"] == "media/val/samples/step-00000012-1.png"
        assert np.array_equal(read_png((tmp_path / lines[1]["path"]).read_bytes()),
                              img.permute(1, 2, 0).numpy())
        assert (tmp_path / lines[4]["path"]).read_text() == "hello"
        assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]

    def test_media_pass_a_thinned_sink(self) -> None:
        """``sink_every`` thins scalars only: every image reaches the sink."""
        got: list[str] = []

        class Shows:
            def scalars(self, records: Any) -> None:
                return None

            def media(self, records: Any) -> None:
                got.extend(r.name for r in records)

            def firing(self, *_: object) -> None:
                return None

            def close(self) -> None:
                return None

        ts = Timestamp(step=1)
        store = MetricStore(lambda: ts, [Every(Shows(), "100 steps")])
        for s in range(1, 4):
            ts = Timestamp(step=s)
            store.put_image(f"img{s}", torch.zeros(1, 2, 2))
        store.flush()
        assert got == ["img1", "img2", "img3"]

    def test_tensorboard(self, tmp_path: Path) -> None:
        """TensorBoard gets the image (its size), the histogram and the text."""
        pytest.importorskip("tensorboard")
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        from schedtrain.monitors.tensorboard import TensorBoardWriter

        store = MetricStore(lambda: Timestamp(step=3), [TensorBoardWriter(tmp_path)])
        store.put_image("samples", torch.zeros(3, 4, 5))
        store.put_histogram("w", torch.randn(100))
        store.put_text("note", "hello")
        store.close()
        acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "histograms": 0,
                                                             "tensors": 0})
        acc.Reload()
        (image,) = acc.Images("samples")
        assert (image.step, image.width, image.height) == (3, 5, 4)
        assert read_png(image.encoded_image_string).shape == (4, 5, 3)
        (hist,) = acc.Histograms("w")
        assert hist.histogram_value.num == 100
        assert acc.Tags()["tensors"] == ["note/text_summary"]


class Samples(Callback):
    """Puts an image, a histogram and text that depend on the weights, as a callback
    showing predictions would."""

    def _trigger(self) -> None:
        w = next(self.trainer.model.parameters()).detach()
        self.metrics.put_image("val/samples", (w.abs().reshape(1, 1, -1) % 1.0))
        self.metrics.put_histogram("weights", w)
        self.metrics.put_text("note", f"step {self.now.step}: {float(w.sum()):.6f}")


class Crash(Callback):
    """Fails the run at one step (as a kill would end it there), when armed."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at

    def _trigger(self) -> None:
        if self.now.step == self.at:
            raise RuntimeError("killed")


def _trainer(run_dir: Path, crash: int | None = None) -> Trainer:
    model, opt = tiny_model()
    return Trainer(model, opt, UnevenData([3, 3]), mse,
                   schedule=Schedule({"samples": every("2 steps") | on("epoch_end"),
                                      "save": every("1 step"), "crash": every("1 step")}),
                   bindings={"samples": Samples(), "save": ModelSaver(keep=None),
                             "crash": Crash(crash)},
                   max_epochs=2, run_dir=run_dir, handle_signals=False)


def _media_log(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        row = json.loads(line)
        row.pop("time", None)
        row.pop("seconds", None)
        row.pop("duration", None)
        out.append(row)
    return out


@settings(max_examples=6, deadline=None)
@given(st.integers(2, 6))  # a kill at step 1 comes before the first checkpoint
def test_resumed_run_writes_the_same_media(tmp_path_factory: pytest.TempPathFactory,
                                           crash: int) -> None:
    """Killed at any step and resumed, the run's events.jsonl and its media files equal
    the uninterrupted run's (values pending at the checkpoint included)."""
    tmp = tmp_path_factory.mktemp("media")
    _trainer(tmp / "full").fit()
    with pytest.raises(RuntimeError, match="killed"):
        _trainer(tmp / "cut", crash).fit()
    resumed = _trainer(tmp / "cut")
    found = resumed.checkpoints.newest_valid(tmp / "cut" / "checkpoints")
    assert found is not None
    resumed.resume(found)
    resumed.fit()
    assert _media_log(tmp / "cut") == _media_log(tmp / "full")
    files = {p.relative_to(tmp / "full"): p.read_bytes()
             for p in (tmp / "full" / "media").rglob("*") if p.is_file()}
    assert len(files) == sum(1 for x in _media_log(tmp / "full") if x["kind"] == "media")
    assert {p.relative_to(tmp / "cut"): p.read_bytes()
            for p in (tmp / "cut" / "media").rglob("*") if p.is_file()} == files


def test_plan_metrics_reads_a_log_with_media(tmp_path: Path) -> None:
    """``plan --metrics RUN_DIR/events.jsonl`` reads the scalars of a log that also
    names media files, leaving the media lines out."""
    from schedtrain.simulation.metric_stream import read_metrics

    store = _store(tmp_path)
    store.put("val/loss", 0.5)
    store.put_image("val/samples", torch.zeros(1, 2, 2))
    store.put_text("note", "hi")
    store.flush()
    assert [r.name for r in read_metrics(tmp_path / "events.jsonl")] == ["val/loss"]
