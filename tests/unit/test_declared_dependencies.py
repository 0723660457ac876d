"""Every import in models/, service/, tests/ and scripts/ is a declared dependency.

A fresh virtual environment gets only what pyproject.toml declares, so an import that
works here only because a package was installed by hand fails for every new user (issue
11: pytest-asyncio and orjson). The source is read with ``ast`` (imports inside functions
and ``try`` blocks count too), each top-level module is mapped to the distribution that
installs it with ``importlib.metadata.packages_distributions()``, and that distribution
must be declared where the importing file is installed:

- models/ and service/: ``[project] dependencies``; the export and eager-torch code
  (``TORCH_SIDE``) may also use the ``torch`` extra, and nothing else may, since the
  server runs without torch when it serves ONNX bundles; likewise only the external
  session store (``REDIS_SIDE``) may use the ``redis`` extra (sessions in-process need none),
  only the gRPC service (``GRPC_SIDE``) the ``grpc`` extra, and only the experience log
  (``EXPERIENCE_SIDE``) the ``experience`` extra;
- tests/ and scripts/: the ``test`` extra (which includes ``rlserve[torch]``) and the core.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RUNTIME_TREES = ("models", "service")
TEST_TREES = ("tests", "scripts")
# Modules of models/ and service/ that may import the torch extra (torch, onnx, onnxscript):
# the eager catalog and networks, the exporter, and the TorchScript runtime.
TORCH_SIDE = (
    "models/catalog.py",
    "models/custom.py",
    "models/rllib_import.py",
    "models/networks/*.py",
    "models/export/exporter.py",
    "models/export/onnx.py",
    "models/export/torchlib_registry.py",
    "models/export/torchscript.py",
    "service/*runtime/torchscript.py",
    # Reading msgpack checkpoints is part of exporting them (`rlserve export CHECKPOINT`).
    "models/checkpoint/files.py",
    # The new stack's RLModules, rebuilt in torch to be exported (`rlserve export` of a
    # new-stack checkpoint); serving their bundles needs no torch.
    "models/rlmodules/*.py",
    # `rlserve export --trust-code` (custom modules traced): torch, and ray from the user's
    # training environment (RLLIB_SIDE), which rlserve never installs.
    "models/traced/*.py",
)
# The external session store's client (imported only when RLSERVE_SESSION_STORE is set).
# The start-up check pings the configured store (service/startup.py, only with a store set);
# a shadow keeps its per-session state there (service/shadow/durable.py, only with a store set).
REDIS_SIDE = ("service/sessions/redis_client.py", "service/startup.py", "service/shadow/durable.py")
# The Open Inference Protocol's gRPC service (imported only when RLSERVE_GRPC_PORT is set).
GRPC_SIDE = ("service/protocols/kserve_v2/grpc_*.py",)
# The experience log's Parquet side (imported only when RLSERVE_EXPERIENCE_LOG is set, and by
# `rlserve experience`).
EXPERIENCE_SIDE = ("service/experience/*.py",)
# Scripts that run in an environment of their own, never the project's: they record RLlib's
# answers with ray (scripts/record_rllib_checkpoint.py says how), or serve the benchmark's
# policy from another serving system (scripts/bench_peers.py makes their environments).
# Only these may import ray.
OWN_ENVIRONMENT = {"scripts/record_rllib_checkpoint.py": {"ray"}, "scripts/record_rllib_cases.py": {"ray"},
                   "scripts/rllib_case_meta.py": {"ray"},  # record_rllib_cases.py's case.json metadata
                   "scripts/record_rllib_multiagent.py": {"ray", "pettingzoo"},
                   "scripts/record_rllib_offline_schema.py": {"ray"},
                   "scripts/train_bc_on_experience.py": {"ray", "msgpack_numpy"},
                   "scripts/record_newstack_cases.py": {"ray"},
                   # record_newstack_cases.py's restored-checkpoint readers; dm-tree and
                   # msgpack-numpy come with ray's rllib extra
                   "scripts/newstack_restored.py": {"ray", "tree", "msgpack_numpy"},
                   # record_custom_modules.py (RLlib's example RLModule classes) and its readers
                   "scripts/record_custom_modules.py": {"ray"},
                   "scripts/custom_module_answers.py": {"ray", "tree"},
                   "scripts/newstack_layout.py": {"msgpack_numpy"},
                   "scripts/verify_custom_modules.py": {"ray"},
                   # user module classes the --trust-code tests save and trace in their RLlib venv
                   "tests/fixtures/traced_modules/user_modules.py": {"ray"},
                   "tests/fixtures/traced_modules/save_modules.py": {"ray"},
                   # RLlib's own off-policy estimators, run by tests/service/test_ope_estimators.py in the ray venv
                   "tests/service/rllib_ope_check.py": {"ray"},
                   # the user's custom ModelV2 classes of tests/fixtures/checkpoints-custom, their
                   # registration, and the fresh-process check of those recordings
                   "tests/fixtures/checkpoints-custom/custom_models_src/my_models.py": {"ray"},
                   "tests/fixtures/checkpoints-custom/custom_models_src/register_my_models.py": {"ray"},
                   "scripts/check_rllib_checkpoint.py": {"ray"},
                   # bench_peers.py's peer servers, each run by the python of its own environment
                   "scripts/peers/peer_litserve.py": {"litserve"}, "scripts/peers/peer_mosec.py": {"mosec"},
                   "scripts/peers/peer_rayserve.py": {"ray"}, "scripts/peers/peer_pytriton.py": {"pytriton"},
                   # openpi's robot client, run by tests/e2e/test_openpi_e2e.py in its venv (numpy<2)
                   "tests/e2e/openpi_play.py": {"openpi_client"}}
# The --trust-code exporter imports ray only there, inside the functions that restore a
# checkpoint's code (the user's environment has it; rlserve neither installs nor needs it).
RLLIB_SIDE = {"models/traced/loader.py": {"ray"}, "models/traced/export.py": {"ray"},
              "models/traced/modelv2.py": {"ray"}}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> tuple[str, list[str]]:
    """('name', [extras]) of a PEP 508 string such as 'rlserve[torch]' or 'uvloop>=0.19; ...'."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, f"unreadable requirement {requirement!r} in pyproject.toml"
    extras = [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]
    return _normalize(match.group(1)), extras


def declared(*groups: str) -> set[str]:
    """Distributions declared by the core ("") and the named extras, self-references expanded."""
    project = PYPROJECT["project"]
    this = _normalize(project["name"])
    extras = project.get("optional-dependencies", {})
    names: set[str] = set()
    todo, seen = list(groups), set()
    while todo:
        group = todo.pop()
        if group in seen:
            continue
        seen.add(group)
        for req in project["dependencies"] if group == "" else extras[group]:
            name, wanted = _requirement_name(req)
            if name == this:
                todo.extend(wanted)
            else:
                names.add(name)
    return names


def own_top_level_names() -> set[str]:
    """The project's own importable top-level names, as pyproject's setuptools table installs them
    (``packages.find`` include patterns, or ``packages`` / ``package-dir`` after a rename)."""
    tool = PYPROJECT.get("tool", {}).get("setuptools", {})
    packages = tool.get("packages", {})
    find = packages.get("find", {}) if isinstance(packages, dict) else {}
    names = {p.rstrip("*").split(".")[0] for p in find.get("include", [])}
    if isinstance(packages, list):
        names |= {p.split(".")[0] for p in tool["packages"]}
    names |= {p.split(".")[0] for p in tool.get("package-dir", {}) if p}
    names.discard("")
    assert names, "pyproject.toml names no packages of this project"
    return names


def _helper_names() -> set[str]:
    """Modules tests and scripts import from their own folders (conftest and the tests put
    tests/, tests/service/, tests/e2e/ and scripts/ on sys.path)."""
    names: set[str] = set()
    for tree in TEST_TREES:
        for path in (REPO / tree).rglob("*.py"):
            names.add(path.stem)
            names.update(p.name for p in path.relative_to(REPO).parents if p.name)
    return names


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """(top-level module, line) of every absolute import in the file, including the imports
    of code kept in string literals and run in a subprocess (``python -c SCRIPT``)."""
    yield from _imports_of(ast.parse(path.read_text(), filename=str(path)), 0)


def _imports_of(tree: ast.AST, first_line: int) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], first_line + node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], first_line + node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                code = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            yield from _imports_of(code, first_line + node.lineno - 1)


def _files(trees: tuple[str, ...]) -> list[Path]:
    return sorted(p for tree in trees for p in (REPO / tree).rglob("*.py"))


def _allowed(rel: str) -> tuple[set[str], str]:
    if rel.split("/")[0] in TEST_TREES:
        return declared("", "test"), "the core or the 'test' extra"
    if any(fnmatch.fnmatch(rel, pattern) for pattern in TORCH_SIDE):
        return declared("", "torch"), "the core or the 'torch' extra"
    if any(fnmatch.fnmatch(rel, pattern) for pattern in REDIS_SIDE):
        return declared("", "redis"), "the core or the 'redis' extra"
    if any(fnmatch.fnmatch(rel, pattern) for pattern in GRPC_SIDE):
        return declared("", "grpc"), "the core or the 'grpc' extra"
    if any(fnmatch.fnmatch(rel, pattern) for pattern in EXPERIENCE_SIDE):
        return declared("", "experience"), "the core or the 'experience' extra"
    return declared(""), "[project] dependencies"


def test_every_third_party_import_is_declared():
    modules = importlib.metadata.packages_distributions()
    own, helpers = own_top_level_names(), _helper_names()
    runtime_files = [p.relative_to(REPO).as_posix() for p in _files(RUNTIME_TREES)]
    stale = [pat for pat in TORCH_SIDE + REDIS_SIDE + GRPC_SIDE + EXPERIENCE_SIDE
             if not fnmatch.filter(runtime_files, pat)]
    assert not stale, f"TORCH_SIDE / REDIS_SIDE / GRPC_SIDE patterns that match no file (moved?): {stale}"
    problems: list[str] = []
    for path in _files(RUNTIME_TREES + TEST_TREES):
        rel = path.relative_to(REPO).as_posix()
        allowed, where = _allowed(rel)
        local = own | (helpers if rel.split("/")[0] in TEST_TREES else set())
        for name, line in _imports(path):
            if name in sys.stdlib_module_names or name in local or name == "__future__":
                continue
            if name in OWN_ENVIRONMENT.get(rel, ()) or name in RLLIB_SIDE.get(rel, ()):
                continue
            dists = {_normalize(d) for d in modules.get(name, [])}
            if not dists:
                problems.append(f"{rel}:{line}: imports {name!r}, which no installed distribution provides")
            elif not dists & allowed:
                problems.append(f"{rel}:{line}: imports {name!r} (from {sorted(dists)}), not declared in {where}")
    assert not problems, "undeclared imports:\n" + "\n".join(problems)


def test_helper_modules_do_not_shadow_installed_packages():
    """A tests/ or scripts/ module named like an installed package would hide a missing dependency."""
    this = _normalize(PYPROJECT["project"]["name"])
    modules = importlib.metadata.packages_distributions()
    shadowing = sorted(n for n in _helper_names() | own_top_level_names()
                       if {_normalize(d) for d in modules.get(n, [])} - {this})
    assert not shadowing, f"local modules named like installed packages: {shadowing}"


def test_the_walk_sees_the_imports_issue_11_was_about():
    """Not vacuous: it finds orjson, which scripts/bench_server.py imports in the code of the
    minimal app it starts in a subprocess, next to ordinary imports."""
    found = {name: path.name for path in _files(TEST_TREES) for name, _ in _imports(path)}
    assert found.get("orjson") == "bench_server.py"
    assert {"torch", "gymnasium", "numpy", "httpx", "pytest"} <= set(found)


# Markers pytest itself defines; others come from a plugin, or are registered in pyproject.
BUILTIN_MARKS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}
# Markers that only mean something with a plugin installed (without it, pytest refuses the
# async test: "async def functions are not natively supported").
PLUGIN_MARKS = {"asyncio": "pytest-asyncio"}


def _marks(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark" and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "pytest"):
            yield node.attr, node.lineno


def test_every_pytest_marker_is_builtin_registered_or_from_a_declared_plugin():
    registered = {m.split(":")[0].strip() for m in PYPROJECT["tool"]["pytest"]["ini_options"].get("markers", [])}
    test_deps = declared("", "test")
    problems, used = [], set()
    for path in _files(("tests",)):
        for mark, line in _marks(path):
            used.add(mark)
            if mark in BUILTIN_MARKS or mark in registered:
                continue
            plugin = PLUGIN_MARKS.get(mark)
            if plugin is None:
                problems.append(f"{path.relative_to(REPO)}:{line}: pytest.mark.{mark} is neither built in, "
                                "registered in [tool.pytest.ini_options] markers, nor from a known plugin")
            elif plugin not in test_deps:
                problems.append(f"{path.relative_to(REPO)}:{line}: pytest.mark.{mark} needs {plugin}, "
                                "which the 'test' extra does not declare")
    assert "asyncio" in used, "the service tests' pytest.mark.asyncio was not seen: the walk is broken"
    assert not problems, "\n".join(problems)


@pytest.mark.asyncio
async def test_async_tests_run_under_the_declared_pytest_asyncio():
    """This test body runs only when pytest-asyncio is installed and active."""
    assert "pytest-asyncio" in declared("test")
