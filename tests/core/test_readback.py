"""The boundary every read-back file passes (``schedtrain.readback``): a regular file
only, never a blocking open, caps on size and nesting, and typed bounded records whose
failures name the file and the key path in one printable line."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedtrain.errors import RunDirError
from schedtrain.readback import (
    MAX_DEPTH,
    MAX_LIST,
    DamagedFile,
    at_most,
    between,
    check_depth,
    invalid,
    parse_json,
    printable,
    read_json,
    structure,
    valid,
)


@attrs.frozen
class _Stretch:
    ranks: int = attrs.field(validator=between(1, 64))
    batches: int = attrs.field(validator=between(0, 1000))


@attrs.frozen
class _Record:
    name: str = attrs.field(validator=valid)
    cost: float
    stretches: tuple[_Stretch, ...] = attrs.field(validator=at_most(8))
    pair: tuple[int, int] = (0, 0)
    note: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.pair[0] > self.pair[1]:
            raise invalid("pair", "expected the first at most the second")


_GOOD = {"name": "ckpt", "cost": 1.5, "stretches": [{"ranks": 2, "batches": 3}]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=4),
    max_leaves=20)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


class TestParse:
    @given(json_values, st.integers(1, 6))
    def test_depth_check_agrees_with_the_nesting(self, value: object, limit: int) -> None:
        """The linear scan counts nesting as the value has it, strings ignored."""
        text = json.dumps(value)
        assert check_depth(text, limit) == (_depth(value) <= limit)

    @given(st.text(alphabet="[]{}\"\\,:", max_size=40))
    def test_brackets_inside_strings_do_not_count(self, s: str) -> None:
        assert check_depth(json.dumps([s] * 3), 1)

    def test_deep_nesting_is_refused_before_python_recurses(self) -> None:
        with pytest.raises(DamagedFile, match=f"more than {MAX_DEPTH} levels"):
            parse_json("[" * 100_000 + "]" * 100_000, "retime.json")

    @pytest.mark.parametrize(("text", "key"), [
        ('{"applied": [{"step": ' + "[" * 100 + "]" * 100 + "}]}", "applied[0].step"),
        ("[" * 100, ""),
        ('{"a": "[[[[", "b": {"c": [1, ' + "[" * 40 + "]" * 40 + "]}}", "b.c"),
    ])
    def test_too_deep_names_the_key_where_it_nests(self, text: str, key: str) -> None:
        with pytest.raises(DamagedFile) as err:
            parse_json(text, "retimes.json")
        assert err.value.key == key

    @pytest.mark.parametrize("text", ['{"a": NaN}', "[Infinity]", "[-Infinity]", "{", "\xff"])
    def test_not_json_is_refused_in_one_line(self, text: str) -> None:
        with pytest.raises(DamagedFile) as err:
            parse_json(text.encode("latin-1"), "run.json")
        assert "\n" not in str(err.value) and "'run.json'" in str(err.value)


class TestReadJson:
    def test_a_fifo_is_refused_without_blocking(self, tmp_path: Path) -> None:
        fifo = tmp_path / "retime.json"
        os.mkfifo(fifo)
        done: list[BaseException] = []

        def read() -> None:
            try:
                read_json(fifo)
            except BaseException as exc:  # the thread reports what it got
                done.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "reading a FIFO blocked"
        assert isinstance(done[0], DamagedFile) and "FIFO" in str(done[0])

    def test_a_directory_and_a_device_are_refused(self, tmp_path: Path) -> None:
        (tmp_path / "run.json").mkdir()
        for path, kind in ((tmp_path / "run.json", "directory"), (Path("/dev/zero"), "device")):
            with pytest.raises(DamagedFile, match=kind):
                read_json(path)

    def test_a_file_over_the_cap_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "run.json"
        path.write_text(json.dumps({"x": "y" * 200}))
        with pytest.raises(DamagedFile, match="longer than 100 bytes"):
            read_json(path, limit=100)

    def test_missing_is_left_to_the_caller(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError):
            read_json(tmp_path / "absent.json")

    def test_a_damaged_file_is_a_run_directory_error(self) -> None:
        """The command line shows it as one line with exit 2, as every RunDirError."""
        assert issubclass(DamagedFile, RunDirError)


class TestStructure:
    def test_a_good_record(self) -> None:
        rec = structure(_GOOD, _Record, "f.json")
        assert rec.stretches == (_Stretch(2, 3),) and rec.cost == 1.5

    @pytest.mark.parametrize(("change", "key"), [
        ({"name": "a\nerror: forged"}, "name"),
        ({"cost": math.nan}, "cost"),
        ({"cost": 1e308 * 10}, "cost"),
        ({"cost": "1.5"}, "cost"),
        ({"stretches": [{"ranks": 2, "batches": 3}, {"ranks": 0, "batches": 1}]},
         "stretches[1].ranks"),
        ({"stretches": [{"ranks": 2, "batches": -1}]}, "stretches[0].batches"),
        ({"stretches": [{"ranks": True, "batches": 1}]}, "stretches[0].ranks"),
        ({"stretches": [{"ranks": 1, "batches": 1}] * 9}, "stretches"),
        ({"stretches": [{"ranks": 1, "batches": 1}] * (MAX_LIST + 1)}, "stretches"),
        ({"pair": [1]}, "pair"),
        ({"pair": [2, 1]}, "pair"),
        ({"note": 5}, "note"),
    ])
    def test_a_bad_field_is_named_by_its_key_path(self, change: dict[str, object],
                                                  key: str) -> None:
        with pytest.raises(DamagedFile) as err:
            structure({**_GOOD, **change}, _Record, "ckpt.pt", "run.data")
        assert err.value.key == f"run.data.{key}"
        assert str(err.value).startswith(f"'ckpt.pt': run.data.{key}: expected")

    def test_a_missing_key_is_named(self) -> None:
        with pytest.raises(DamagedFile) as err:
            structure({"name": "x", "cost": 1.0}, _Record, "f.json")
        assert err.value.key == "stretches" and "missing" in err.value.reason

    @given(json_values)
    def test_anything_is_a_record_or_one_printable_line(self, value: object) -> None:
        data = {**_GOOD, "stretches": value} if isinstance(value, list) else value
        try:
            structure(data, _Record, "f.json")
        except DamagedFile as exc:
            text = str(exc)
            assert printable(text) == text and len(text) <= 300

    @given(st.text())
    def test_printable_leaves_no_control_character(self, text: str) -> None:
        out = printable(text)
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
