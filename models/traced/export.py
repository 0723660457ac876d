"""Export a custom RLModule by tracing it: ``rlserve export CHECKPOINT --trust-code`` (torch, ray).

    ModuleCheckpoint (read as data, trust_code) ─► RLlib restores the module (loader.py)
        ─► connector layout (plan.py; a module reading a Dict/Tuple gets it rebuilt)
        ─► action distribution, established by comparison (dists.py)
        ─► TracedModulePolicy (policy.py) ─► checks on the eager module:
              forward_exploration == forward_inference; does it mask with obs["action_mask"]?
        ─► export_bundle: ONNX (torch.export) + TorchScript (jit.trace), each verified against
           the eager module at batch sizes 1, 3, 64 ─► a stateful module's runtimes stepped
           through a sequence with their state carried, against the eager module

What it writes is an ordinary bundle: the server needs neither ray nor the module's code.
A module that cannot be traced (Python control flow on tensor values, an op the exporters
lack) is refused naming the first call of the user's code on the failing path.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlserve.models.connectors import ConnectorLayout, ConnectorPlanError, plan_connectors
from rlserve.models.distributions.masking import FLOAT_MIN
from rlserve.models.export.bundle import Bundle, BundleError
from rlserve.models.export.exporter import export_bundle
from rlserve.models.export.from_rlmodule import connector_preprocessor, env_spaces, input_maker
from rlserve.models.newstack import ModuleCheckpoint
from rlserve.models.rlmodules.graph import ConnectorGraph
from rlserve.models.spaces import space_from_json
from rlserve.models.traced.dists import served_distribution
from rlserve.models.traced.layout import ObsLayout, StateLayout
from rlserve.models.traced.loader import LoadedModule, TraceError, import_user_modules, load_module, require_rllib
from rlserve.models.traced.policy import DIST_INPUTS, TracedModulePolicy
from rlserve.models.traced.sequence import check_sequence

__all__ = ["export_traced_module"]

MASK_KEY = "action_mask"
_CATEGORICALS = ("TorchCategorical", "TorchMultiCategorical")
Progress = Callable[[str], None]


def export_traced_module(
    ckpt: ModuleCheckpoint, out_dir: str | Path, *, formats: tuple[str, ...] = ("onnx", "torchscript"),
    name: str | None = None, version: str | None = None, progress: Progress | None = None,
    explore: bool | None = None, normalize_actions: bool | None = None, clip_actions: bool | None = None,
    imports: Sequence[str] = (),
) -> Bundle:
    """Trace ``ckpt``'s module (read with ``trust_code``) into a verified bundle at ``out_dir``.
    Raises ``TraceError`` (one line) for what cannot be served exactly, ``BundleError`` when a
    runtime disagrees with the eager module."""
    say = progress or (lambda _msg: None)
    label = ckpt.module_class
    say(f"restoring {label.rpartition('.')[2]} with RLlib (--trust-code: running the checkpoint's code)")
    require_rllib(label)
    import_user_modules(imports)
    loaded = load_module(ckpt.files, label)
    model, layout, connectors = _build(ckpt, loaded, label, say)
    obs_space, action_space = env_spaces(ckpt)
    source = {**ckpt.source_json(), "exported_by": "tracing", "action_dist_class": model.dist.label,
              "dist_inputs": "the distribution's parameters" if model.dist.folded else "the module's"}
    say("tracing the module into ONNX and TorchScript")
    make_inputs = input_maker(model.signature(), copy.deepcopy(obs_space), connectors)
    with tracing(label):
        bundle = export_bundle(
            model, obs_space=obs_space, action_space=action_space, model_config=ckpt.model_config, out_dir=out_dir,
            formats=formats, name=name or ckpt.module_id, version=version, progress=say,
            explore=ckpt.explore if explore is None else explore, action_dist=model.dist.spec.to_json(),
            preprocessor=connector_preprocessor(layout),
            normalize_actions=ckpt.normalize_actions if normalize_actions is None else normalize_actions,
            clip_actions=ckpt.clip_actions if clip_actions is None else clip_actions,
            source=source, connectors=connectors, make_inputs=make_inputs,
        )
    if model.signature().state:
        say("stepping the runtimes through a sequence with their state carried")
        check_sequence(bundle, model, make_inputs)
    return bundle


def _build(ckpt: ModuleCheckpoint, loaded: LoadedModule, label: str,
           say: Progress) -> tuple[TracedModulePolicy, ConnectorLayout, dict[str, Any]]:
    member = loaded.member
    obs_space, action_space = env_spaces(ckpt)
    try:
        layout = plan_connectors([(s.name, s.params) for s in ckpt.connectors.env_to_module], obs_space,
                                 action_space, ckpt.observation_space, structured_module=True)
    except ConnectorPlanError as exc:
        raise TraceError(f"module {ckpt.module_id!r} ({label}): {exc}") from None
    dist = served_distribution(member, ckpt.action_space)
    say(f"action distribution {dist.label.rpartition('.')[2]} served as {dist.spec.name}"
        + (" (its constructor traced into the graph)" if dist.folded else ""))
    stateful = bool(member.is_stateful())
    state = StateLayout.of(member.get_initial_state() if stateful else None)
    obs_layout = ObsLayout(space_from_json(layout.module_obs_space)) if layout.module_obs_space else None
    connectors = {**layout.to_json(), "normalize_actions": ckpt.normalize_actions, "clip_actions": ckpt.clip_actions}
    model = TracedModulePolicy(loaded, ConnectorGraph(layout.graph), layout.obs_shape, state, dist, obs_layout,
                               stateful=stateful, has_value=_has_value(member),
                               action_width=layout.prev["action_width"])
    model.eval()
    make_inputs = input_maker(model.signature(), copy.deepcopy(obs_space), connectors)
    _check_exploration(loaded, model, make_inputs(32, 7), label)
    if obs_layout is not None and _masks_with_observation(model, obs_layout, dist.spec, make_inputs(8, 11)):
        connectors["observation_mask_key"] = MASK_KEY
        say(f"the module masks its logits with the observation's {MASK_KEY!r}: the server masks with it too")
    return model, layout, connectors


_EXPLORATION_PASSES = 4  # seeded forward_exploration passes compared with forward_inference


def _has_value(member: Any) -> bool:
    from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI

    return isinstance(member, ValueFunctionAPI)


def _tensors(model: TracedModulePolicy, inputs: dict[str, np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(inputs[n], dtype=np.float32))
            for n in model.signature().input_names]


def _check_exploration(loaded: LoadedModule, model: TracedModulePolicy, inputs: dict[str, np.ndarray],
                       label: str) -> None:
    """One graph serves both: refuse a module whose exploring forward computes other dist inputs."""
    if model.connectors.uses_prev or model.connectors.frame_state_shape is not None:
        return  # history stages in the graph: compared through the runtimes' verification only
    args = _tensors(model, inputs)
    with torch.no_grad():
        module_obs, _ = model.connectors(args[0], None, None, None)
        states = list(args[1:1 + model.module_states])
        acting = loaded.forward("forward_inference", model.batch(module_obs, states)).get(DIST_INPUTS)
        if acting is None:
            raise TraceError(f"{label}: forward_inference answers no {DIST_INPUTS}: the module acts for no agent "
                             "(a shared encoder?); export the modules that do, which reach it through their "
                             "MultiRLModule")
        # A module that samples inside forward_exploration (RLlib's autoregressive example) can draw the
        # deterministic answer by chance on a few rows: several seeded passes over many rows, any one differing.
        with torch.random.fork_rng():
            for seed in range(_EXPLORATION_PASSES):
                torch.manual_seed(seed)
                exploring = loaded.forward("forward_exploration", model.batch(module_obs, states))[DIST_INPUTS]
                if acting.shape != exploring.shape or not torch.allclose(acting, exploring, rtol=1e-6, atol=1e-6):
                    break
            else:
                return
    raise TraceError(f"{label}: forward_exploration computes other action_dist_inputs than forward_inference "
                     "(or a random one); a bundle serves one forward pass for both")


def _masks_with_observation(model: TracedModulePolicy, obs_layout: ObsLayout, spec: Any,
                            inputs: dict[str, np.ndarray]) -> bool:
    """Whether the module turns the logits of actions its observation's mask forbids into FLOAT_MIN."""
    space = obs_layout.space
    width = spec.num_outputs if spec.name in _CATEGORICALS else 0
    keys = getattr(space, "spaces", {})
    if MASK_KEY not in keys or not width or int(np.prod(keys[MASK_KEY].shape or (0,))) != width:
        return False
    start = sum(int(np.prod(keys[k].shape or (1,))) for k in sorted(keys) if k < MASK_KEY)
    obs = inputs["obs"].copy()
    rng = np.random.default_rng(5)
    mask = (rng.random((len(obs), width)) < 0.5).astype(np.float32)
    mask[:, 0] = 1.0
    obs[:, start:start + width] = mask
    with torch.no_grad():
        dist_inputs = model(*_tensors(model, {**inputs, "obs": obs}))[0].numpy()
    return bool(np.all(dist_inputs[mask == 0] <= FLOAT_MIN / 2) and np.all(dist_inputs[mask == 1] > FLOAT_MIN / 2))


class tracing:
    """Tracer warnings are refusals; a failure inside the exporters names the user's call."""

    def __init__(self, label: str):
        self.label = label
        self._warnings = warnings.catch_warnings()
        # torch's exporters log (and dump graphs) on their way to a failure; the refusal says it
        # in one line, and --traceback shows the chain.
        self._torch_log = logging.getLogger("torch")
        self._level = self._torch_log.level

    def __enter__(self) -> None:
        self._warnings.__enter__()
        warnings.simplefilter("error", torch.jit.TracerWarning)
        self._torch_log.setLevel(logging.CRITICAL)
        self._quiet = contextlib.ExitStack()  # the exporters print graphs on failure
        self._quiet.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self._quiet.enter_context(contextlib.redirect_stderr(io.StringIO()))

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._quiet.close()
        self._warnings.__exit__(kind, exc, tb)
        self._torch_log.setLevel(self._level)
        if exc is None or isinstance(exc, BundleError | TraceError) or not isinstance(exc, Exception):
            return
        chain = _chain(exc)
        where = _user_frame(chain)
        inner = chain[-1]
        first = _ANSI.sub("", str(inner)).strip().splitlines()[0] if str(inner).strip() else ""
        raise TraceError(f"{self.label} cannot be traced{where}: {type(inner).__name__}: {first[:300]}") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NOT_USER = ("/torch/", "/rlserve/", "/models/traced/", "/models/export/", "/onnx", "/contextlib.py")


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and what caused it, outermost first (torch.export wraps the error it met)."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and all(cause is not c for c in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def _user_frame(chain: list[BaseException]) -> str:
    """' at FILE:LINE in FUNC (CODE)' for the deepest frame outside torch and rlserve, if any."""
    for link in reversed(chain):  # the innermost error first: it met the user's line
        frames = [f for f in traceback.extract_tb(link.__traceback__) if not any(n in f.filename for n in _NOT_USER)]
        if frames:
            f = frames[-1]
            return f" at {Path(f.filename).name}:{f.lineno} in {f.name} ({(f.line or '').strip()[:80]})"
    return ""
