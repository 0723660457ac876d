"""The wheel installs everything under one top-level name, ``rlserve``.

The repository keeps its folders ``models/`` and ``service/``; pyproject's package-dir maps
them to ``rlserve.models`` and ``rlserve.service`` (and ``service/client`` to
``rlserve.client``). Built here as pip builds it, the wheel must hold every Python folder of
the repository under ``rlserve/`` and nothing named ``models`` or ``service`` at its top.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("models", "service"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("rlserve-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_nothing_but_rlserve_at_the_top(wheel_names: list[str]) -> None:
    tops = {name.split("/", 1)[0] for name in wheel_names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"rlserve"}


def test_every_package_folder_is_in_the_wheel(wheel_names: list[str]) -> None:
    expected = set()
    for folder, prefix in (("models", "rlserve/models"), ("service", "rlserve/service")):
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT / folder).as_posix()
            if folder == "service" and rel.startswith("client/"):
                expected.add("rlserve/" + rel)
            else:
                expected.add(f"{prefix}/{rel}")
    missing = expected - set(wheel_names)
    assert not missing, f"packages missing from [tool.setuptools] packages: {sorted(missing)}"


def test_client_is_not_shipped_twice(wheel_names: list[str]) -> None:
    assert not [n for n in wheel_names if n.startswith("rlserve/service/client/")]
    assert "rlserve/client/policy_client.py" in wheel_names


def test_default_models_are_package_data(wheel_names: list[str]) -> None:
    for name in ("cartpole", "cartpole-memory"):
        assert f"rlserve/service/default_models/{name}/manifest.json" in wheel_names
