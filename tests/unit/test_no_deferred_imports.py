"""No module of ``models/`` or ``service/`` imports a project module inside a function, or
only for the type checker (docs/architecture.md, "Import direction").

Such an import is how an import circle is held shut: two modules that need each other
load because one of them waits until it runs. The circle is then still there, only hidden
from the import graph that tests/unit/test_layering.py checks. The shared names belong in
a module both sides may import instead.

Imports of optional or heavy third-party libraries inside functions stay allowed (torch,
onnxruntime, ray, redis, grpc, pyarrow, uvicorn, ...): an ONNX-only server never loads
torch. A project module imported inside a function is allowed only where ``ALLOWED``
lists it, with the reason on its line: mostly a module that imports an optional extra's
library at its top, loaded only when that extra's feature runs.
"""

from __future__ import annotations

import ast

from .source_imports import ROOT, from_module, module_name

_TORCH = "imports torch at its top (the [torch] extra): loaded only when an export runs"
_RAY = "imports torch at its top and restores the user's code with ray: only for a --trust-code export"
_EXPORTER = "the exporter loads only when the server exports a checkpoint: a server of bundles never loads it"
_PYARROW = "imports pyarrow at its top (the [experience] extra): loaded only where an experience log is read or written"
_START = "the app and its frameworks load after the checks that refuse a start, and never in a --workers supervisor"

# (file, the module it imports inside a function) -> why it may.
ALLOWED: dict[tuple[str, str], str] = {
    ("models/export/__init__.py", "rlserve.models.export.exporter"):
        "export_bundle is resolved on first use, so that loading bundles through this package stays torch-free",
    ("models/export/cli.py", "rlserve.models.catalog"): _TORCH,
    ("models/export/cli.py", "rlserve.models.custom"): _TORCH,
    ("models/export/cli.py", "rlserve.models.export.exporter"): _TORCH,
    ("models/export/cli.py", "rlserve.models.rllib_import"): _TORCH,
    ("models/export/cli_newstack.py", "rlserve.models.rlmodules.catalog"): _TORCH,
    ("models/export/cli_newstack.py", "rlserve.models.traced.export"): _RAY,
    ("models/export/cli_traced.py", "rlserve.models.traced.modelv2"): _RAY,
    ("models/export/from_checkpoint.py", "rlserve.models.catalog"): _TORCH,
    ("models/export/from_checkpoint.py", "rlserve.models.export.exporter"): _TORCH,
    ("models/export/from_checkpoint.py", "rlserve.models.rllib_import"): _TORCH,
    ("models/export/from_checkpoint.py", "rlserve.models.traced.export"): _RAY,
    ("models/export/from_rlmodule.py", "rlserve.models.export.exporter"): _TORCH,
    ("models/export/from_rlmodule.py", "rlserve.models.rlmodules.catalog"): _TORCH,
    ("models/export/set_cli.py", "rlserve.models.rllib_import"): _TORCH,
    ("models/export/set_cli.py", "rlserve.models.rlmodules.catalog"): _TORCH,
    ("service/app.py", "rlserve.service.protocols.kserve_v2.grpc_server"):
        "imports grpcio and protobuf at its top (the [grpc] extra): loaded only when RLSERVE_GRPC_PORT is set",
    ("service/experience/cli.py", "rlserve.service.experience.reader"): _PYARROW,
    ("service/evaluation/cli.py", "rlserve.service.evaluation.evaluate"): _PYARROW,
    ("service/experience/log.py", "rlserve.service.experience.tables"): _PYARROW,
    ("service/experience/writer.py", "rlserve.service.experience.tables"): _PYARROW,
    ("service/server.py", "rlserve.service.act.protocol"): _START,
    ("service/server.py", "rlserve.service.app"): _START,
    ("service/serving/checkpoints.py", "rlserve.models.export.from_checkpoint"): _EXPORTER,
    ("service/serving/checkpoints.py", "rlserve.models.export.from_rlmodule"): _EXPORTER,
    ("service/serving/checkpoints.py", "rlserve.models.rllib_import"): _TORCH,
    ("service/serving/checkpoints.py", "rlserve.models.rlmodules.catalog"): _TORCH,
    ("service/serving/policy_sets.py", "rlserve.models.export.from_rlmodule"): _EXPORTER,
    ("service/serving/policy_sets.py", "rlserve.models.export.policy_set_export"): _EXPORTER,
    ("service/serving/policy_sets.py", "rlserve.models.rllib_import"): _TORCH,
    ("service/serving/policy_sets.py", "rlserve.models.rlmodules.catalog"): _TORCH,
}


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of this repository (``rlserve.x.y``)."""
    parts = name.split(".")[1:]
    if not parts:
        return True
    top = {"models": ["models"], "service": ["service"], "client": ["service", "client"]}.get(parts[0])
    if top is None:
        return False
    path = ROOT.joinpath(*top, *parts[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The project modules an import statement loads (absolute names; a name imported from
    a package counts as that module where it is one); none for a third-party import."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "rlserve"]
    module = from_module(node, package)
    if module.split(".")[0] != "rlserve":
        return []
    found = [f"{module}.{alias.name}" for alias in node.names if _is_module(f"{module}.{alias.name}")]
    return found or [module]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def deferred_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, project module) of every import inside a function (or a lambda) of ``source``
    and every import under ``if TYPE_CHECKING:``; ``module`` is the source's module name."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, hidden: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = hidden or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import | ast.ImportFrom):
                if inside:
                    found.extend((child.lineno, target) for target in _targets(child, package))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for part in child.body:
                    visit(ast.Module(body=[part], type_ignores=[]), True)
                for part in child.orelse:
                    visit(ast.Module(body=[part], type_ignores=[]), inside)
            else:
                visit(child, inside)

    visit(ast.parse(source), False)
    return found


def _found() -> dict[tuple[str, str], list[int]]:
    """(file, module) -> the lines that import it inside a function, for every file."""
    files = sorted([*(ROOT / "models").rglob("*.py"), *(ROOT / "service").rglob("*.py")])
    assert len(files) > 100, "the source tree was not found"
    found: dict[tuple[str, str], list[int]] = {}
    for path in files:
        for line, target in deferred_imports(path.read_text(), module_name(path), path.name == "__init__.py"):
            found.setdefault((str(path.relative_to(ROOT)), target), []).append(line)
    return found


def test_no_project_module_is_imported_inside_a_function() -> None:
    hidden = [f"{file}:{lines[0]} imports {module} inside a function (or only for the type checker)"
              for (file, module), lines in sorted(_found().items()) if (file, module) not in ALLOWED]
    assert hidden == [], ("move the names both modules need to a module both may import, or, for an optional "
                          "extra's module, list it in ALLOWED with the reason:\n" + "\n".join(hidden))


def test_every_allowed_import_is_still_there() -> None:
    """An entry whose import has gone would let a new circle in under its name."""
    found = _found()
    assert [entry for entry in ALLOWED if entry not in found] == []
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_checker_sees_imports_inside_functions_and_for_the_type_checker() -> None:
    """The test above would pass vacuously if ``deferred_imports`` found nothing."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "from rlserve.service.step import rows\n"
        "if TYPE_CHECKING:\n"
        "    from rlserve.service.step.batch import StepOutput\n"
        "def f():\n"
        "    import torch\n"
        "    from . import codec\n"
        "    from ..engine import batcher\n"
        "    from rlserve.service.errors import BundleInvalid\n"
        "class C:\n"
        "    async def g(self):\n"
        "        import rlserve.models.spaces\n"
    )
    assert deferred_imports(source, "rlserve.service.step.kept") == [
        (5, "rlserve.service.step.batch"), (8, "rlserve.service.step.codec"), (9, "rlserve.service.engine.batcher"),
        (10, "rlserve.service.errors"), (13, "rlserve.models.spaces")]
