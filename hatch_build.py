"""Build hook: the editable install's import hook gets a name pytest leaves alone.

An editable install (``pip install -e .``, dev-mode-exact) puts two files in
site-packages: a ``.pth`` that imports a small module at every interpreter start, and that
module, which maps ``schedtrain`` to this checkout. hatchling names the module
``_editable_impl_schedtrain``. pytest marks for assertion rewriting every top-level module
a distribution with a ``pytest11`` entry point lists (ours: the schedule-coverage
plugin), finds that one already imported, and warns
(``PytestAssertRewriteWarning: Module already imported so cannot be rewritten``) in every
test run of every project where schedtrain is installed so, or stops the run under
``-W error``. pytest skips modules named ``__editable__*`` (setuptools' name for the same
hook), so the editable wheel renames it to ``__editable___schedtrain_finder``.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

OLD = "_editable_impl_schedtrain"
NEW = "__editable___schedtrain_finder"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def rename_import_hook(wheel: Path) -> bool:
    """Rewrite the editable wheel in place with the hook module renamed (its ``.pth``
    and RECORD to match); a wheel without hatchling's hook module is left as it is.
    Returns whether it changed."""
    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    names = {info.filename for info, _ in entries}
    if f"{OLD}.py" not in names:
        return False
    out: list[tuple[zipfile.ZipInfo, bytes]] = []
    for info, content in entries:
        name, data = info.filename, content
        if name == f"{OLD}.py":
            name = f"{NEW}.py"
        elif name.endswith(".pth"):
            data = data.replace(f"import {OLD}".encode(), f"import {NEW}".encode())
        elif name.endswith(".dist-info/RECORD"):
            continue  # written last, from the files as they now are
        renamed = zipfile.ZipInfo(name, info.date_time)
        renamed.external_attr, renamed.compress_type = info.external_attr, info.compress_type
        out.append((renamed, data))
    record = next(info.filename for info, _ in entries if info.filename.endswith("/RECORD"))
    lines = [_record_line(i.filename, d) for i, d in out] + [f"{record},,"]
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in out:
            z.writestr(info, data)
        z.writestr(zipfile.ZipInfo(record, out[0][0].date_time), "\n".join(lines) + "\n")
    tmp.replace(wheel)
    return True


class EditableHookName(BuildHookInterface):
    """Renames the import hook of an editable wheel (see the module)."""

    PLUGIN_NAME = "custom"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if version == "editable":
            rename_import_hook(Path(artifact_path))
