"""Loader for real RLlib new-API-stack checkpoints with RLlib's recorded answers.

Format: ``shared/oracle/newstack/README.md`` (one folder per case: ``checkpoint/``,
``reference.json``, ``reference.npz``, ``episode_states.npz`` for recurrent cases).

Cases come from ``RLSERVE_NEWSTACK_DIR`` (default ``../shared/oracle/newstack`` relative to
the repository root), so other folders of the same format can be run, and from this
repository's ``tests/fixtures/newstack`` (written by ``scripts/record_newstack_cases.py``).
Custom-module cases (the same format, module classes of RLlib's examples: exported by
tracing) are a family of their own: ``RLSERVE_CUSTOM_MODULES_DIR`` (default
``../shared/oracle/custom-modules``) and ``tests/fixtures/custom-modules``; the functions
below take ``family="custom"`` for them.
Tests select cases by what they hold (multi-agent, recurrent, connectors), never by name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
OWN_CASES = REPO_ROOT / "tests" / "fixtures" / "newstack"
RTOL = ATOL = 1e-5  # the bar for RLlib's floats (logp, dist inputs, values)


def assert_close(actual: Any, expected: Any, what: str) -> None:
    """The served floats equal RLlib's within the tolerance."""
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=RTOL, atol=ATOL, err_msg=what)


OWN_CUSTOM_CASES = REPO_ROOT / "tests" / "fixtures" / "custom-modules"


def _shared(variable: str, folder: str) -> Path:
    env = os.environ.get(variable)
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT / ".." / "shared" / "oracle" / folder).resolve()


def json_leaves(value: Any) -> list[float]:
    """A JSON action (or recorded row) as its leaves in RLlib's order (Dict keys sorted)."""
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in json_leaves(value[k])]
    return np.ravel(np.asarray(value, np.float64)).tolist()


def json_row(fixed: dict[str, Any], key: str, i: int) -> Any:
    """Row ``i`` of a recorded ``fixed`` field as JSON (a Dict field per key)."""
    value = fixed[key]
    if isinstance(value, dict):
        return {k: json_row(value, k, i) for k in value}
    return np.asarray(value[i]).tolist()


def episode_step_body(episode: dict[str, Any], t: int, session: str, **extra: Any) -> dict[str, Any]:
    """The act body of a recorded episode's step ``t`` in a session: the observation, and after
    the first step what RLlib's episode holds (its sampled action and the reward it got)."""
    body: dict[str, Any] = {"observation": episode["obs"][t], "session_id": session, "explore": False, **extra}
    if t == 0:
        body["episode_start"] = True
    else:
        body["prev_action"] = episode["action"][t - 1]
        body["reward"] = episode["reward"][t - 1]
    return body


def check_value_and_logp(got: dict[str, Any], j: int, fixed: dict[str, Any], i: int, where: str) -> None:
    """A batch answer's row ``j`` against recorded row ``i``: the value (null where the module has
    no value function) and the logp of the deterministic action."""
    if "value" in fixed:
        assert_close(got["value"][j], fixed["value"][i], f"{where}: value")
    else:
        assert got["value"][j] is None, f"{where}: a module without a value function answers null"
    if "logp" in fixed:
        assert_close(got["logp"][j], fixed["logp"][i], f"{where}: logp of the deterministic action")


def newstack_dir() -> Path:
    return _shared("RLSERVE_NEWSTACK_DIR", "newstack")


def custom_modules_dir() -> Path:
    return _shared("RLSERVE_CUSTOM_MODULES_DIR", "custom-modules")


# label -> the folder it names; a family's labels
_ROOTS = {"shared": newstack_dir, "own": lambda: OWN_CASES, "custom": custom_modules_dir,
          "own-custom": lambda: OWN_CUSTOM_CASES}
_FAMILIES = {"newstack": ("shared", "own"), "custom": ("custom", "own-custom")}


def _cases_in(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "reference.json").is_file() and (p / "checkpoint").is_dir())


def case_ids(family: str = "newstack") -> list[str]:
    """``<folder label>/<case folder>`` for every case in the family's two folders."""
    return [f"{label}/{p.name}" for label in _FAMILIES[family] for p in _cases_in(_ROOTS[label]())]


def case_path(case_id: str) -> Path:
    label, _, name = case_id.partition("/")
    return _ROOTS[label]() / name


@dataclass
class NewStackCase:
    id: str
    path: Path
    reference: dict[str, Any]
    arrays: dict[str, np.ndarray]  # reference.npz
    states: dict[str, np.ndarray]  # episode_states.npz ({} for feedforward cases)

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    @property
    def multi_agent(self) -> bool:
        return bool(self.reference.get("multi_agent"))

    @property
    def recurrent(self) -> bool:
        return bool(self.reference.get("recurrent"))

    @property
    def module_ids(self) -> list[str]:
        return list(self.reference["modules"])

    def fixed(self, agent: str | None = None) -> dict[str, Any]:
        """The ``fixed`` answers (of one agent in a multi-agent case) as arrays stacked over
        the observations: from ``reference.npz`` (``fixed[/agent_<id>]/<field>[/<key>...]``,
        a nested dict where the field has keys), else from the JSON."""
        prefix = "fixed" if agent is None else f"fixed/agent_{agent}"
        fixed = self.reference["fixed"] if agent is None else self.reference["fixed"][f"agent_{agent}"]
        out: dict[str, Any] = {}
        for field, value in fixed.items():
            key = f"{prefix}/{field}"
            nested = {k[len(key) + 1:]: v for k, v in self.arrays.items() if k.startswith(key + "/")}
            if key in self.arrays:
                out[field] = self.arrays[key]
            elif nested:
                out[field] = _unflatten(nested)
            else:
                out[field] = value
        return out

    def observations(self, agent: str | None = None) -> list[Any]:
        """The raw observations as JSON values (a Dict observation as an object per row; a
        multi-agent case's rows ``{agent_id: obs}`` give the agent's)."""
        count = len(self.reference["fixed"]["obs"])
        fixed = self.fixed(agent)
        if "obs" in fixed:
            return [_row(fixed["obs"], i) for i in range(count)]
        return [row[agent] for row in self.reference["fixed"]["obs"]]


def _unflatten(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _row(value: Any, i: int) -> Any:
    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    row = value[i]
    return row.tolist() if isinstance(row, np.ndarray | np.generic) else row


def _npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@cache
def load_case(case_id: str) -> NewStackCase:
    path = case_path(case_id)
    reference = json.loads((path / "reference.json").read_text())
    return NewStackCase(case_id, path, reference, _npz(path / "reference.npz"), _npz(path / "episode_states.npz"))


def single_agent_ids(family: str = "newstack") -> list[str]:
    return [i for i in case_ids(family) if not load_case(i).multi_agent]


def episode_ids(family: str = "newstack") -> list[str]:
    """Single-agent cases with a recorded episode (recurrent modules, frame stacks)."""
    return [i for i in case_ids(family) if "episode" in load_case(i).reference and not load_case(i).multi_agent]


def module_pairs(family: str = "newstack") -> list[tuple[str, str]]:
    """(case id, module id) for every module of every case, multi-agent ones included."""
    return [(i, m) for i in case_ids(family) for m in load_case(i).module_ids]


def served_name(case: NewStackCase, module_id: str) -> str:
    """The model name a module is served and exported under: the case id as a folder name,
    and the module's id after it in a case of several modules."""
    suffix = f"-{module_id}" if len(case.module_ids) > 1 else ""
    return case.id.replace("/", "-") + suffix


def module_checkpoint(case: NewStackCase, module_id: str) -> Path:
    """The folder ``--checkpoint NAME=DIR`` names for the module: the algorithm's, or in a
    case of several modules the module's own (its connectors come from the algorithm around it)."""
    from rlserve.models.newstack.layout import RL_MODULE_DIR

    return case.checkpoint if len(case.module_ids) == 1 else case.checkpoint / RL_MODULE_DIR / module_id


def exported_module(tmp_path_factory: Any, case: NewStackCase, module_id: str) -> Path:
    """``rlserve export CHECKPOINT --name NAME [--module-id ID]`` (its main, in this process)
    of one module, done once per test run for every test and xdist worker (``run_cache``):
    the conformance tests check the bundle against RLlib, and the end-to-end server serves
    it from its export cache. Read only."""
    from run_cache import shared_folder

    from rlserve.models.export.cli import export_main

    name = served_name(case, module_id)

    def build(out: Path) -> None:
        argv = [str(case.checkpoint), "--out", str(out), "--name", name, "--quiet"]
        if len(case.module_ids) > 1:
            argv += ["--module-id", module_id]
        assert export_main(argv) == 0, f"rlserve export {' '.join(argv)} failed"

    return shared_folder(tmp_path_factory, f"newstack-exports/{name}", build)
