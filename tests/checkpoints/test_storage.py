"""Checkpoint storage behind a URL: a manifest commits, retries, leftovers, missing extras."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
import s3fs
import torch

from schedtrain.checkpoints.storage import (
    FsspecStorage,
    LocalStorage,
    StorageError,
    manifest_name,
    open_storage,
)


def _store(bucket: tuple[str, dict[str, Any]], **kw: Any) -> FsspecStorage:
    url, options = bucket
    return FsspecStorage(f"{url}/run/checkpoints", options, **kw)


def _save(value: float) -> Any:
    return lambda f: torch.save({"w": torch.tensor([value])}, f)


class TestObjectStoreCommit:
    """A checkpoint on S3 or Cloud Storage exists once its manifest is written."""

    def test_write_commits_and_reads_back(self, object_bucket: tuple[str, dict[str, Any]]) -> None:
        """Written, listed as committed, and read back byte for byte."""
        store = _store(object_bucket)
        store.write("step-00000004.pt", _save(1.5))
        assert store.committed() == ["step-00000004.pt"]
        state = torch.load(io.BytesIO(store.read("step-00000004.pt")), weights_only=True)
        assert state["w"].item() == 1.5

    def test_uncommitted_is_ignored_and_cleaned(self, object_bucket: tuple[str, dict[str, Any]]
                                                ) -> None:
        """A file without its manifest is no checkpoint, and clean_leftovers removes it
        while committed ones stay."""
        store = _store(object_bucket)
        store.write("step-00000004.pt", _save(1.0))
        store.fs.pipe_file(f"{store.root}/step-00000008.pt", b"half a checkpoint")
        assert store.committed() == ["step-00000004.pt"]
        with pytest.raises(StorageError, match="never committed"):
            store.read("step-00000008.pt")
        assert store.clean_leftovers() == ["step-00000008.pt"]
        assert not store.fs.exists(f"{store.root}/step-00000008.pt")
        assert store.committed() == ["step-00000004.pt"]

    def test_damaged_file_is_named(self, object_bucket: tuple[str, dict[str, Any]]) -> None:
        """A file changed after its commit fails its manifest's checksum, by URL."""
        store = _store(object_bucket)
        store.write("step-00000004.pt", _save(1.0))
        store.fs.pipe_file(f"{store.root}/step-00000004.pt", b"flipped")
        with pytest.raises(StorageError, match="does not match its manifest") as info:
            store.read("step-00000004.pt")
        assert str(info.value.path).endswith("run/checkpoints/step-00000004.pt")

    def test_delete_uncommits_first(self, object_bucket: tuple[str, dict[str, Any]]) -> None:
        """Deleting removes the manifest and the file."""
        store = _store(object_bucket)
        store.write("step-00000004.pt", _save(1.0))
        store.delete("step-00000004.pt")
        assert store.committed() == []
        assert not store.fs.exists(f"{store.root}/step-00000004.pt")
        assert not store.fs.exists(f"{store.root}/step-00000004.manifest.json")

    def test_missing_folder_lists_nothing(self, object_bucket: tuple[str, dict[str, Any]]) -> None:
        """A folder nothing was written to yet holds no checkpoint."""
        assert _store(object_bucket).committed() == []


class _Flaky:
    """The real S3 filesystem, whose first ``fail`` writes (of manifests only, with
    ``commits``) drop the connection."""

    def __init__(self, fs: s3fs.S3FileSystem, fail: int, *, commits: bool = False) -> None:
        self.fs, self.fail, self.calls, self.commits = fs, fail, 0, commits

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def pipe_file(self, path: str, data: bytes) -> None:
        if self.commits and not path.endswith(".manifest.json"):
            self.fs.pipe_file(path, data)
            return
        self.calls += 1
        if self.calls <= self.fail:
            raise ConnectionError("connection reset by peer")
        self.fs.pipe_file(path, data)


class TestRetries:
    """Transient errors are retried with backoff, then reported by name."""

    def test_transient_error_retried(self, s3_bucket: tuple[str, dict[str, Any]]) -> None:
        """Two dropped connections, then the write and its commit go through."""
        url, options = s3_bucket
        flaky = _Flaky(s3fs.S3FileSystem(**options), fail=2)
        waits: list[float] = []
        store = FsspecStorage(f"{url}/ck", fs=flaky, sleep=waits.append)
        store.write("step-00000002.pt", _save(2.0))
        assert waits == [0.5, 1.0]
        assert store.committed() == ["step-00000002.pt"]

    def test_gives_up_naming_url_and_operation(self, s3_bucket: tuple[str, dict[str, Any]]
                                               ) -> None:
        """Past its deadline (at least its attempts, the backoff doubling up to 4 s), the
        failure names the URL, the operation and the cause, and leaves no uncommitted
        file."""
        url, options = s3_bucket
        flaky = _Flaky(s3fs.S3FileSystem(**options), fail=100)
        waits: list[float] = []
        store = FsspecStorage(f"{url}/ck", fs=flaky, attempts=3, sleep=waits.append)
        with pytest.raises(StorageError) as info:
            store.write("step-00000002.pt", _save(2.0))
        tries = len(waits) + 1
        assert str(info.value) == (
            f"checkpoint '{url}/ck/step-00000002.pt': write failed after {tries} attempts "
            f"in {sum(waits):.0f} s (ConnectionError: connection reset by peer)")
        assert waits[:4] == [0.5, 1.0, 2.0, 4.0] and max(waits) == 4.0
        assert sum(waits) < store.bound() <= sum(waits) + 4.0
        assert store.committed() == []
        assert store.clean_leftovers() == []


    def test_failed_commit_removes_its_file(self, s3_bucket: tuple[str, dict[str, Any]]
                                            ) -> None:
        """A file written whose manifest cannot be: the writer deletes the file, so no
        leftover waits for the next run, and the error names the commit."""
        url, options = s3_bucket
        flaky = _Flaky(s3fs.S3FileSystem(**options), fail=100, commits=True)
        store = FsspecStorage(f"{url}/ck", fs=flaky, attempts=2, sleep=lambda _: None)
        with pytest.raises(StorageError,
                           match=r"commit \(write the manifest\) failed after \d+ attempts"):
            store.write("step-00000002.pt", _save(2.0))
        assert not flaky.fs.exists(f"{store.root}/step-00000002.pt")
        assert store.committed() == []


class TestOtherProtocols:
    """The same commit on any fsspec filesystem."""

    @pytest.mark.parametrize("scheme", ["file", "memory"])
    def test_write_commit_read(self, tmp_path: Any, scheme: str) -> None:
        """file:// (its folders made) and memory://: written, committed by a manifest,
        read back; a file without a manifest is cleaned up."""
        url = f"file://{tmp_path}/a/ck" if scheme == "file" else f"memory://{tmp_path.name}/ck"
        store = open_storage(url)
        assert isinstance(store, FsspecStorage) and store.committed() == []
        store.write("step-00000001.pt", _save(3.0))
        store.fs.pipe_file(f"{store.root}/step-00000002.pt", b"cut short")
        assert store.committed() == ["step-00000001.pt"]
        state = torch.load(io.BytesIO(store.read("step-00000001.pt")), weights_only=True)
        assert state["w"].item() == 3.0
        assert store.clean_leftovers() == ["step-00000002.pt"]
        if scheme == "file":
            assert sorted(p.name for p in (tmp_path / "a" / "ck").iterdir()) == [
                "step-00000001.manifest.json", "step-00000001.pt"]


class TestOpen:
    """Which storage a location gets."""

    def test_path_is_local(self, tmp_path: Any) -> None:
        """A path is the local disk, committed by rename."""
        store = open_storage(tmp_path)
        assert isinstance(store, LocalStorage)
        store.write("step-00000001.pt", _save(1.0))
        assert store.committed() == ["step-00000001.pt"]
        assert not list(tmp_path.glob(manifest_name("step-00000001.pt")))

    def test_missing_protocol_package_names_extra(self, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
        """A URL whose protocol's package is missing names the extra to install."""
        monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
        with pytest.raises(StorageError, match=r"pip install 'schedtrain\[gcs\]'"):
            open_storage("gs://bucket/ck")

    def test_unknown_protocol(self) -> None:
        """A protocol fsspec does not know is refused by URL."""
        with pytest.raises(StorageError, match=r"nosuch://x/ck.*not a storage URL"):
            open_storage("nosuch://x/ck")


def test_local_runs_never_import_fsspec() -> None:
    """fsspec and s3fs are imported only for a URL: the package, the trainer and the
    command line load without them."""
    import subprocess
    import sys

    code = ("import sys, schedtrain, schedtrain.training, schedtrain.cli, "
            "schedtrain.checkpoints.storage; "
            "print(sorted(m for m in ('fsspec', 's3fs', 'gcsfs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
