"""The import direction of the packages and of the server's floors (docs/architecture.md,
"Import direction"), checked on the source.

- ``rlserve.models`` (catalog, exporter, torch-free run-time parts) never imports the server,
  the client or web code.
- ``rlserve.client`` imports nothing of the server or the catalog: an environment process
  needs only httpx (and gymnasium for the runner).
- The server (``rlserve.service``) is built in floors. Each floor imports only the floors
  ``ALLOWED`` lists for it (and ``rlserve.models``); no floor is listed both ways, so no two
  floors import each other, and no module imports itself back through others.
- Only the routers and the app factory import FastAPI; the request edge, other wire
  protocols and policy sets are framework-free.

Serving ONNX bundles without torch is checked by running the server in a subprocess
(tests/service/test_svc_torch_free.py). tests/unit/test_no_deferred_imports.py keeps
imports out of functions, where a circle would hide from these checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .source_imports import ROOT, from_module, module_name, package_of

# The server's floors, bottom to top: the modules of each (``rlserve.service.<first name>``).
FLOORS: dict[str, tuple[str, ...]] = {
    # settings, errors, the device a runtime is asked for, the log lines and error bodies' guards
    "ground": ("", "settings", "errors", "device_request", "access_log", "redaction"),
    "engine": ("engine",),  # batcher, runtimes, pipeline, metrics: runs batches, knows no model's step
    "experience": ("experience",),  # the experience log: fed through a recorder, never sees a request
    "sessions": ("sessions",),  # session stores and records
    "step": ("step",),  # one model's step: rows, codec, prepare, the batch step
    "shadow": ("shadow",),  # a candidate run on a live version's traffic, off the live path
    "serving": ("serving",),  # loaded models: loading, checkpoints, registry, repository
    "evaluation": ("evaluation",),  # off-policy evaluation on a log: a candidate bundle run offline
    "act": ("act",),  # the request edge: transports, decode, the act use case
    "protocols": ("protocols",),  # other wire protocols, on the act use case
    "multiagent": ("multiagent",),  # policy sets, on the act use case
    "stream": ("stream",),  # WebSocket streams of one session (act use case) or episode (multiagent's) each
    "api": ("api",),  # the FastAPI routers
    "app": ("app",),  # the app factory
    "process": ("startup", "server", "workers", "serve_command", "cli"),  # `rlserve serve` and its processes
}

# What each floor may import besides itself and rlserve.models.
ALLOWED: dict[str, frozenset[str]] = {
    "ground": frozenset(),
    "engine": frozenset({"ground"}),
    "experience": frozenset({"ground"}),
    "sessions": frozenset({"ground", "experience"}),
    "step": frozenset({"ground", "engine", "sessions"}),
    "shadow": frozenset({"ground", "engine", "experience", "sessions", "step"}),
    "serving": frozenset({"ground", "engine", "experience", "sessions", "step", "shadow"}),
    "evaluation": frozenset({"ground", "engine", "experience", "sessions", "step", "serving"}),
    "act": frozenset({"ground", "engine", "sessions", "step", "serving"}),
    "protocols": frozenset({"ground", "engine", "sessions", "step", "serving", "act"}),
    "multiagent": frozenset({"ground", "engine", "sessions", "step", "serving", "act"}),
    "stream": frozenset({"ground", "engine", "sessions", "step", "serving", "act", "multiagent"}),
    "api": frozenset({"ground", "experience", "sessions", "serving", "act", "protocols", "multiagent"}),
    "app": frozenset({"ground", "engine", "experience", "sessions", "step", "shadow", "serving", "act", "protocols",
                      "multiagent", "stream", "api"}),
    "process": frozenset({"ground", "sessions", "serving", "act", "app"}),
}

# Module circles not opened yet: {module, module} -> why.
CIRCLES_LEFT: dict[frozenset[str], str] = {}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved), and for a
    ``from`` import each name it takes (``module.name``)."""
    package = package_of(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = from_module(node, package)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _files(folder: str, exclude: str | None = None) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    if exclude is not None:
        files = [f for f in files if not f.is_relative_to(ROOT / exclude)]
    assert files, f"no Python files under {folder}"
    return files


def _offending(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in files:
        for module in sorted(_imports(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    return bad


def _floor(module: str) -> str:
    """The floor of a module of rlserve.service (the package itself is on the ground)."""
    first = module.split(".")[2] if module.count(".") >= 2 else ""
    floors = [floor for floor, names in FLOORS.items() if first in names]
    assert len(floors) == 1, f"{module}: on {floors or 'no floor'}; place it in FLOORS"
    return floors[0]


def _service_modules() -> dict[str, Path]:
    return {module_name(path): path for path in _files("service", exclude="service/client")}


def _project_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (``from package import module`` counts
    the module; a name from a module counts the module)."""
    found = set()
    for name in _imports(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def test_every_module_of_the_server_is_on_one_floor() -> None:
    for module in _service_modules():
        _floor(module)


def test_each_floor_imports_only_the_floors_below_it_that_it_may() -> None:
    modules = _service_modules()
    bad = []
    for module, path in modules.items():
        floor = _floor(module)
        for imported in sorted(_project_imports(path, modules)):
            other = _floor(imported)
            if other != floor and other not in ALLOWED[floor]:
                bad.append(f"{path.relative_to(ROOT)} ({floor}) imports {imported} ({other})")
    assert bad == []


def test_no_two_floors_may_import_each_other() -> None:
    """The allowed directions have an order: each floor's allowed floors come before it."""
    order = list(FLOORS)
    assert set(ALLOWED) == set(order)
    for floor, below in ALLOWED.items():
        assert all(order.index(other) < order.index(floor) for other in below), floor


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The circles of an import graph (module -> the modules it imports): its strongly
    connected parts of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            part = set()
            while True:
                other = stack.pop()
                part.add(other)
                if other == module:
                    break
            if len(part) > 1:
                circles.append(frozenset(part))

    for module in graph:
        if module not in index:
            visit(module)
    return circles


def test_no_module_imports_itself_back() -> None:
    modules = {module_name(path): path for folder in ("models", "service") for path in _files(folder)}
    graph = {module: _project_imports(path, modules) - {module} for module, path in modules.items()}
    circles = [sorted(circle) for circle in _circles(graph) if circle not in CIRCLES_LEFT]
    assert circles == []
    assert all(circle in _circles(graph) for circle in CIRCLES_LEFT), "a circle was opened: drop it from CIRCLES_LEFT"


# Libraries a part of the project must not import: (what, folder, excluded folder, forbidden).
RULES = [
    ("models never import the server, the client or web code", "models", None,
     ("rlserve.service", "rlserve.client", "fastapi", "starlette", "uvicorn", "httpx")),
    ("the client imports nothing of the server or the catalog", "service/client", None,
     ("rlserve.service", "rlserve.models", "fastapi", "starlette", "uvicorn", "torch", "onnxruntime")),
]


@pytest.mark.parametrize(("rule", "folder", "exclude", "forbidden"), RULES, ids=[r[0] for r in RULES])
def test_import_direction(rule: str, folder: str, exclude: str | None, forbidden: tuple[str, ...]) -> None:
    assert _offending(_files(folder, exclude), forbidden) == [], rule


def test_only_the_routers_and_the_app_import_fastapi() -> None:
    """The request edge (the act routes answer inside uvicorn's protocol), other wire
    protocols, policy sets and every floor below them are framework-free."""
    allowed = {ROOT / "service" / "app.py"}
    files = [f for f in _files("service") if f not in allowed and not f.is_relative_to(ROOT / "service" / "api")]
    assert _offending(files, ("fastapi", "starlette")) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The rules above would pass vacuously if ``_imports`` found nothing."""
    imports = _imports(ROOT / "service" / "step" / "prepare.py")
    assert "rlserve.service.engine.pipeline" in imports
    assert _offending([ROOT / "service" / "app.py"], ("fastapi",)) != []
    modules = _service_modules()
    assert "rlserve.service.engine.pipeline" in _project_imports(ROOT / "service" / "step" / "prepare.py", modules)
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
