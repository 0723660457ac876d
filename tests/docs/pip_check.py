"""``pip install ...`` as the doc runner runs it: check that it is already satisfied.

The suite runs from an install of this checkout (``.ci/run`` installs ``.[test]`` into a
fresh environment). Running a documented ``pip install .`` again would replace that
install and take minutes, so the runner's shell sends ``pip`` here instead: every
requirement the line names must be installed, with the extras it asks for, or this exits 1
naming what is missing (so a documented extra that does not exist fails the docs).
``.``/``.[extras]`` means the project in the current directory (its pyproject.toml).
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

OPTIONS_WITH_VALUE = {"-e", "--editable", "-r", "--requirement", "-c", "--constraint", "-i", "--index-url"}


def requirement_specs(argv: list[str]) -> list[str]:
    if not argv or argv[0] != "install":
        raise SystemExit(f"pip {' '.join(argv)}: the doc runner only checks 'pip install' lines")
    specs, args = [], iter(argv[1:])
    for arg in args:
        if arg in ("-e", "--editable"):
            specs.append(next(args))
        elif arg in OPTIONS_WITH_VALUE:
            raise SystemExit(f"pip install {arg}: not supported by the doc runner's check")
        elif not arg.startswith("-"):
            specs.append(arg)
    if not specs:
        raise SystemExit("pip install: no requirement named")
    return specs


def as_requirement(spec: str) -> Requirement:
    """A requirement string; a path (``.``, ``.[redis]``) becomes the project it holds."""
    path, _, extras = spec.partition("[")
    if path.startswith((".", "/")):
        name = tomllib.loads((Path(path) / "pyproject.toml").read_text())["project"]["name"]
        return Requirement(f"{name}[{extras}" if extras else name)
    return Requirement(spec)


def missing(requirement: Requirement, seen: set[str]) -> list[str]:
    """What of ``requirement`` (and its extras' requirements, recursively) is not installed."""
    key = f"{requirement.name}{sorted(requirement.extras)}"
    if key in seen:
        return []
    seen.add(key)
    try:
        dist = metadata.distribution(requirement.name)
    except metadata.PackageNotFoundError:
        return [str(requirement)]
    if requirement.specifier and not requirement.specifier.contains(dist.version, prereleases=True):
        return [f"{requirement} (installed: {dist.version})"]
    provided = set(dist.metadata.get_all("Provides-Extra") or [])
    unknown = sorted(requirement.extras - provided)
    if unknown:
        return [f"{requirement.name}: no extra {', '.join(unknown)} (it has {', '.join(sorted(provided))})"]
    gaps: list[str] = []
    for line in dist.requires or []:
        needed = Requirement(line)
        if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in requirement.extras | {""}):
            needed.marker = None
            gaps += missing(needed, seen)
    return gaps


def main(argv: list[str]) -> int:
    gaps: list[str] = []
    for spec in requirement_specs(argv):
        requirement = as_requirement(spec)
        found = missing(requirement, set())
        gaps += found
        if not found:
            print(f"Requirement already satisfied: {spec}")
    if gaps:
        print("pip install (checked by the doc runner): not installed: " + "; ".join(gaps), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
