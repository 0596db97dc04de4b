"""The package's shape: a torch-free core, no import cycles, small modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "schedtrain"
#: Packages where torch lives; everything else is the torch-free core.
TORCH_PACKAGES = ("callbacks", "training", "monitors", "distributed", "checkpoints",
                  "integrations")
#: Torch-free modules of a torch package that the core may read (they sit with the core).
TORCH_FREE_FOUNDATION = ("schedtrain.distributed", "schedtrain.distributed.vocabulary")
#: Torch-free modules inside a torch package: they import without torch.
TORCH_FREE = (*TORCH_FREE_FOUNDATION, "schedtrain.integrations",
              "schedtrain.integrations.driver", "schedtrain.integrations.driver_control",
              "schedtrain.integrations.driver_state", "schedtrain.integrations.values")
MAX_LINES = 400
#: The layers, lowest first: a module imports only from its own layer or those below
#: (lazy imports inside functions included). Each entry is module-name prefixes.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("schedtrain.time", "schedtrain.errors", "schedtrain.names",
                    "schedtrain.events", "schedtrain.clock", "schedtrain.imports",
                    "schedtrain.files", "schedtrain.urls", "schedtrain.compat",
                    "schedtrain.readback", "schedtrain.nesting", "schedtrain.retention",
                    "schedtrain._version", "schedtrain.logs", "schedtrain.lazy",
                    *TORCH_FREE_FOUNDATION)),
    ("triggers", ("schedtrain.triggers",)),
    ("schedule", ("schedtrain.schedule",)),
    ("simulation", ("schedtrain.simulation",)),
    ("spec", ("schedtrain.spec",)),
    ("planning and testing", ("schedtrain.planning", "schedtrain.testing")),
    ("monitors", ("schedtrain.monitors",)),
    ("distributed", ("schedtrain.distributed",)),
    ("checkpoints", ("schedtrain.checkpoints",)),
    ("callbacks", ("schedtrain.callbacks",)),
    # Run control sits under the loop it serves: the loop, the lifecycle and the assembly
    # read it, and it imports nothing else of training/.
    ("run control", ("schedtrain.training.control",)),
    ("training", ("schedtrain.training",)),
    ("integrations", ("schedtrain.integrations",)),
    ("command line and public face", ("schedtrain.cli", "schedtrain.__main__", "schedtrain")),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(*, core_only: bool) -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).parts
        if core_only and rel[0] in TORCH_PACKAGES and _module_name(path) not in TORCH_FREE:
            continue
        out[_module_name(path)] = path
    return out


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every schedtrain module ``path`` imports, at any depth of the file, and the packages
    those imports load on the way (importing ``a.b.c`` runs ``a/b/__init__.py``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            found |= {p for i in range(2, len(parts) + 1)
                      if (p := ".".join(parts[:i])) in known}
    return found


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    # A submodule's import of its own package is how packages load, not a cycle.
    return {m: {t for t in _imports(p, set(mods)) - {m} if not m.startswith(t + ".")}
            for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


#: The top-level names that need torch (imported when first named, never at import).
TORCH_SIDE_NAMES = ("Callback", "Task", "Trainer")


class TestCore:
    """The torch-free core: time, clock, triggers, table, spec, planning, testing, cli."""

    def test_imports_with_torch_unimportable(self) -> None:
        """Every core module imports with torch made unimportable, and torch stays out."""
        names = [n for n in _modules(core_only=True) if n != "schedtrain.__main__"]
        code = ("import sys, warnings; sys.modules['torch'] = None\n"
                "warnings.simplefilter('ignore', DeprecationWarning)\n"
                + "".join(f"import {m}\n" for m in names)
                + "import schedtrain\n"
                + "[getattr(schedtrain, n) for n in schedtrain.__all__ if n not in "
                + repr(TORCH_SIDE_NAMES) + "]\n"
                + "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0, result.stderr

    def test_no_core_module_imports_the_torch_side_when_imported(self) -> None:
        """At import, the core never imports callbacks, training, monitors or distributed
        (their torch-free modules aside; the CLI's `train` imports training when called)."""
        mods = _modules(core_only=True)
        torch_side = tuple(f"schedtrain.{p}" for p in TORCH_PACKAGES)
        found = {}
        for name, path in mods.items():
            for node in ast.parse(path.read_text()).body:  # module level only
                if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        torch_side) and node.module not in TORCH_FREE):
                    found[name] = node.module
        assert found == {}


def _layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer of tests/docs/test_layout.py")


class TestLayers:
    """Each module imports only from its own layer or the layers below it."""

    def test_every_module_has_a_layer(self) -> None:
        """A new module or wing is placed in a layer (and so checked)."""
        for name in _modules(core_only=False):
            _layer(name)

    def test_no_module_imports_a_layer_above_it(self) -> None:
        """core (time ... planning) never imports the torch side, the torch side never the
        command line, and within each the lower layers never the higher ones."""
        mods = _modules(core_only=False)
        upward = sorted(
            f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
            for m, targets in _graph(mods).items() for t in targets if _layer(t) > _layer(m))
        assert upward == []


#: What reads or writes checkpoint files: only ``schedtrain/checkpoints/`` may call these.
CHECKPOINT_IO = ("torch.save", "torch.load", "shutil.rmtree", "os.remove", "os.unlink")
#: Modules outside the checkpoint owner that delete files of their own (not checkpoints):
#: the run directory's log, status and traceback, and InjectShell's trigger file.
#: (``schedtrain.files`` removes the temporary file of a write that failed.)
OWN_FILE_DELETERS = ("schedtrain.training.run_dir", "schedtrain.callbacks.shell",
                     "schedtrain.files", "schedtrain.planning.requests")


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


class TestCheckpointOwner:
    """Only ``schedtrain.checkpoints`` opens, writes, lists or deletes checkpoint files."""

    def _outside(self) -> dict[str, Path]:
        return {n: p for n, p in _modules(core_only=False).items()
                if not n.startswith("schedtrain.checkpoints")}

    def test_no_other_module_saves_loads_or_removes_trees(self) -> None:
        """``torch.save``/``torch.load``, DCP and recursive deletion are the owner's alone."""
        found = []
        for name, path in self._outside().items():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and _dotted(node.func) in CHECKPOINT_IO:
                    found.append(f"{name}: {_dotted(node.func)}")
                if isinstance(node, ast.ImportFrom | ast.Import):
                    mods = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                            else [a.name for a in node.names])
                    found += [f"{name}: imports {m}" for m in mods
                              if m.startswith("torch.distributed.checkpoint")]
        assert found == []

    def test_no_other_module_deletes_files(self) -> None:
        """Savers prune through the trainer (``delete_checkpoint``), which asks the owner;
        apart from files of their own, no other module unlinks anything."""
        found = []
        for name, path in self._outside().items():
            if name in OWN_FILE_DELETERS:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("unlink", "rmdir")):
                    found.append(f"{name}: .{node.func.attr}()")
        assert found == []


class TestPackage:
    """The whole package: no import cycles, small modules."""

    def test_no_import_cycles(self) -> None:
        """No module imports (directly or through others) one that imports it, lazy imports
        inside functions and the packages an import loads included."""
        assert _cycles(_graph(_modules(core_only=False))) == []

    @pytest.mark.parametrize("name", sorted(_modules(core_only=False)))
    def test_module_is_small(self, name: str) -> None:
        """No module is over 400 lines: each has one job."""
        lines = len(_modules(core_only=False)[name].read_text().splitlines())
        assert lines <= MAX_LINES, size_message(name, lines)


def size_message(name: str, lines: int) -> str:
    """Why a module over the cap fails: a question about its concerns, not an invitation
    to squeeze lines (a module near the cap usually holds two things)."""
    return (f"{name} has {lines} lines (at most {MAX_LINES}): which concerns does it hold? "
            f"Find its folder in docs/architecture.md ('## The folders') and move the one "
            f"that is not the module's job into a module of its own (named for what a "
            f"reader will look for), rather than squeezing lines to fit")


#: A record with more fields than this is built by keyword (``kw_only=True``): with dozens
#: of fields a reordered one is then an error, not two values silently swapped.
MAX_POSITIONAL_FIELDS = 12


def _record_fields(node: ast.ClassDef) -> tuple[int, bool] | None:
    """An attrs class's field count and whether it is keyword-only (``None``: not attrs)."""
    for deco in node.decorator_list:
        call = deco if isinstance(deco, ast.Call) else None
        name = _dotted(call.func if call is not None else deco)
        if name in ("attrs.define", "attrs.frozen", "attrs.mutable", "attr.s", "define",
                    "frozen"):
            kw_only = call is not None and any(
                k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value
                for k in call.keywords)
            fields = [s for s in node.body if isinstance(s, ast.AnnAssign)
                      and "ClassVar" not in ast.unparse(s.annotation)]
            return len(fields), kw_only
    return None


def test_large_records_are_built_by_keyword() -> None:
    """Every attrs record of more than ``MAX_POSITIONAL_FIELDS`` fields is keyword-only."""
    found = []
    for name, path in _modules(core_only=False).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (got := _record_fields(node)) is not None:
                count, kw_only = got
                if count > MAX_POSITIONAL_FIELDS and not kw_only:
                    found.append(f"{name}.{node.name} ({count} fields)")
    assert found == []


def test_no_module_imports_the_package_face() -> None:
    """Inside the package nothing imports ``schedtrain`` itself (``import schedtrain``,
    ``from schedtrain import name``): the face sits above every layer, and the import
    graph sees only submodules (``__version__`` is ``schedtrain._version``'s)."""
    found = []
    for name, path in _modules(core_only=False).items():
        if name == "schedtrain":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "schedtrain" for a in node.names):
                found.append(f"{name}: import schedtrain")
            elif (isinstance(node, ast.ImportFrom) and node.module == "schedtrain"
                  and node.level == 0):
                found += [f"{name}: from schedtrain import {a.name}" for a in node.names
                          if not (PACKAGE / a.name).is_dir()
                          and not (PACKAGE / f"{a.name}.py").is_file()]
    assert found == []


def test_the_size_message_asks_which_concern() -> None:
    """The cap's message points to the folder list and asks what the module holds."""
    message = size_message("schedtrain.training.loop", 412)
    assert "docs/architecture.md" in message and "which concerns" in message
    assert "## The folders" in (PACKAGE.parent / "docs" / "architecture.md").read_text()


def test_public_names_are_exported() -> None:
    """Everything in ``schedtrain.__all__`` exists, and ``dir()`` lists it."""
    import schedtrain

    missing = [n for n in schedtrain.__all__ if not hasattr(schedtrain, n)]
    assert missing == []
    assert set(schedtrain.__all__) <= set(dir(schedtrain))


#: Run control's parts, by the names a module holds them under, and the modules that may
#: set their attributes: the part's own module, or run control for its own parts. No other
#: module pokes them (no late setter, no flag set across modules): they take what they
#: need when built, and say what they hold through calls.
OWNED_PARTS: dict[str, tuple[str, ...]] = {
    "agreement": ("schedtrain.distributed.agreement",),
    "run_state": ("schedtrain.training.run_state",),
    "retimer": ("schedtrain.training.control",),
    "inbox": ("schedtrain.training.control",),
    "control": ("schedtrain.training.control",),
}
#: Attributes set from outside that are not run control's, each with why.
SET_FROM_OUTSIDE = {
    # how the loop runs its steps (an exact clock after each), which the agreement follows
    ("schedtrain.training.loop", "agreement.exact"),
    # the stop the lifecycle records: checkpoints taken from then on hold it
    ("schedtrain.training.fit", "run_state.stopped"),
    # Hugging Face's TrainerControl, which its callbacks answer through: not run control
    ("schedtrain.integrations.transformers", "control.*"),
}
#: What the loop, the lifecycle and the agreement may import of run control.
RUN_CONTROL_FACE = ("schedtrain.training.control", ("RunControl",))


def _holder(node: ast.expr) -> str | None:
    """The name the object whose attribute ``node`` is was reached by (``a.b.c``: ``b``)."""
    value = node.value if isinstance(node, ast.Attribute) else None
    if isinstance(value, ast.Attribute):
        return value.attr
    return value.id if isinstance(value, ast.Name) else None


def _set_attributes(tree: ast.AST) -> list[ast.Attribute]:
    """Every attribute ``tree`` assigns (``x.a = ``, ``x.a += ``, ``setattr(x, "a", ...)``)."""
    found: list[ast.Attribute] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = (
            list(node.targets) if isinstance(node, ast.Assign)
            else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "setattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)):
            targets.append(ast.Attribute(value=node.args[0], attr=str(node.args[1].value),
                                         lineno=node.lineno))
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                if isinstance(t, ast.Attribute):
                    found.append(t)
    return found


def run_control_pokes(sources: dict[str, str]) -> list[str]:
    """Attributes of run control's parts set outside the modules that own them."""
    found = []
    for name, text in sources.items():
        for t in _set_attributes(ast.parse(text)):
            holder = _holder(t)
            owners = OWNED_PARTS.get(holder or "")
            if owners is None or any(name == o or name.startswith(o + ".") for o in owners):
                continue
            if not {(name, f"{holder}.{t.attr}"), (name, f"{holder}.*")} & SET_FROM_OUTSIDE:
                found.append(f"{name}:{t.lineno} sets {holder}.{t.attr}")
    return found


def late_setters(text: str) -> list[str]:
    """Methods of the run state, the agreement or run control that the assembly calls for
    their effect once they are built (a statement that is only the call)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(func := node.value.func, ast.Attribute)
                and _holder(func) in OWNED_PARTS):
            found.append(f"line {node.lineno}: {ast.unparse(node.value)}")
    return found


def run_control_imports(text: str) -> list[str]:
    """What a module imports of run control beyond ``RUN_CONTROL_FACE``."""
    face, names = RUN_CONTROL_FACE
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(face)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(face):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if node.module != face or a.name not in names]
    return found


class TestRunControlOwner:
    """Run control has one owner (``RunControl``): the parts it talks to take what they
    need when built, and the loop, the lifecycle and the agreement see only the owner."""

    def test_no_module_sets_attributes_of_run_controls_parts_from_outside(self) -> None:
        sources = {n: p.read_text() for n, p in _modules(core_only=False).items()}
        assert run_control_pokes(sources) == []

    def test_the_assembly_calls_no_late_setter(self) -> None:
        assert late_setters((PACKAGE / "training" / "parts.py").read_text()) == []

    @pytest.mark.parametrize("module", ["training/loop.py", "training/fit.py",
                                        "distributed/agreement.py"])
    def test_loop_lifecycle_and_agreement_import_only_the_owner(self, module: str) -> None:
        assert run_control_imports((PACKAGE / module).read_text()) == []

    def test_each_rule_finds_what_it_forbids(self) -> None:
        """The pokes, setters and imports the rules were written against are found."""
        poke = "def f(self):\n    self.agreement.retime_asked = False\n"
        assert run_control_pokes({"schedtrain.training.control.retime": poke}) == [
            "schedtrain.training.control.retime:2 sets agreement.retime_asked"]
        assert run_control_pokes({"schedtrain.training.fit": (
            "parts.inbox.requested = parts.inbox.deadline = None\n"
            "setattr(run_state, 'change', None)\n")}) == [
            "schedtrain.training.fit:1 sets inbox.requested",
            "schedtrain.training.fit:1 sets inbox.deadline",
            "schedtrain.training.fit:2 sets run_state.change"]
        assert late_setters("run_state.replay_on_resume(retimer.resume)\n"
                            "x = run_state.position()\n") == [
            "line 1: run_state.replay_on_resume(retimer.resume)"]
        assert run_control_imports(
            "from schedtrain.training.control.inbox import Inbox\n"
            "from schedtrain.training.control import RunControl, RunJournal\n"
            "import schedtrain.training.control.retime\n") == [
            "schedtrain.training.control.inbox.Inbox",
            "schedtrain.training.control.RunJournal",
            "schedtrain.training.control.retime"]
