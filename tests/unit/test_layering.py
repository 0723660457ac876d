"""The import direction of the packages (docs/architecture.md), checked on the source.

- ``rlserve.models`` (catalog, exporter, torch-free run-time parts) never imports the server,
  the client or web code.
- ``rlserve.client`` imports nothing of the server or the catalog: an environment process
  needs only httpx (and gymnasium for the runner).
- The step layer (one model's step) never imports the request edge or the routers.
- Loaded models and sessions never import the request edge or the routers either.
- Only the routers and the app factory import FastAPI.
- The experience log (``service/experience``) is fed by the step layer and never sees HTTP.
- Other wire protocols (``service/protocols``) sit on the act use case without FastAPI;
  the request edge and the layers below it never import them.
- Policy sets (``service/multiagent``) sit on the act use case the same way.

Serving ONNX bundles without torch is checked by running the server in a subprocess
(tests/service/test_svc_torch_free.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[:2] == ["service", "client"]:
        parts = ["client", *parts[2:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["rlserve", *parts])


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
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


RULES = [
    ("models never import the server, the client or web code", "models", None,
     ("rlserve.service", "rlserve.client", "fastapi", "starlette", "uvicorn", "httpx")),
    ("the client imports nothing of the server or the catalog", "service/client", None,
     ("rlserve.service", "rlserve.models", "fastapi", "starlette", "uvicorn", "torch", "onnxruntime")),
    ("the step layer never imports the request edge or the routers", "service/step", None,
     ("rlserve.service.act", "rlserve.service.api", "rlserve.service.app", "rlserve.service.protocols",
      "fastapi", "starlette")),
    ("loaded models never import the request edge or the routers", "service/serving", None,
     ("rlserve.service.act", "rlserve.service.api", "rlserve.service.app", "rlserve.service.protocols",
      "fastapi", "starlette")),
    ("sessions never import the request edge, the routers or the step layer", "service/sessions", None,
     ("rlserve.service.act", "rlserve.service.api", "rlserve.service.step", "fastapi", "starlette")),
    ("the experience log is fed by the batch step and never sees HTTP", "service/experience", None,
     ("rlserve.service.act", "rlserve.service.api", "rlserve.service.app", "rlserve.service.protocols",
      "rlserve.service.serving", "fastapi", "starlette")),
    ("the request edge is framework-free (no FastAPI)", "service/act", None,
     ("fastapi", "rlserve.service.protocols", "rlserve.service.multiagent")),
    ("policy sets sit on the act use case, framework-free", "service/multiagent", None,
     ("rlserve.service.api", "rlserve.service.app", "rlserve.service.protocols", "fastapi", "starlette")),
    ("other wire protocols sit on the act use case, framework-free", "service/protocols", None,
     ("rlserve.service.api", "rlserve.service.app", "fastapi", "starlette")),
]


@pytest.mark.parametrize(("rule", "folder", "exclude", "forbidden"), RULES, ids=[r[0] for r in RULES])
def test_import_direction(rule: str, folder: str, exclude: str | None, forbidden: tuple[str, ...]) -> None:
    assert _offending(_files(folder, exclude), forbidden) == [], rule


def test_only_the_routers_and_the_app_import_fastapi() -> None:
    allowed = {ROOT / "service" / "app.py"}
    files = [f for f in _files("service") if f not in allowed and not f.is_relative_to(ROOT / "service" / "api")]
    assert _offending(files, ("fastapi",)) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The rules above would pass vacuously if ``_imports`` found nothing."""
    imports = _imports(ROOT / "service" / "step" / "prepare.py")
    assert "rlserve.service.engine.pipeline" in imports
    assert _offending([ROOT / "service" / "app.py"], ("fastapi",)) != []
