"""Action distributions against RLlib's recorded numbers.

Cases are chosen by content: every case whose case.json names an ``action_dist``. Dist
inputs are ``model_out`` for ``dist/*`` keys (recurrent ``[T, B]`` axes flattened) and
``probe/dist_inputs`` for ``probe/dist/*``. Methods that RLlib itself failed on
(``dist_errors``/``probe_dist_errors``) must raise our documented DistributionError.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from oracle import (
    OracleCase,
    assert_close,
    load_case,
    oracle_dirs_text,
    read_meta,
    select_cases,
)

from conformance.heads import HEAD_KINDS
from conformance.keys_checked import mark_fields, mark_io
from rlserve.models.distributions import (
    ActionDistSpec,
    DistributionError,
    get_action_dist,
)
from rlserve.models.distributions.actions import flatten_actions
from rlserve.models.distributions.masking import apply_action_mask
from rlserve.models.distributions.structure import (
    flatten_leaves,
    leaf_paths,
    leaf_spaces,
    path_str,
    unflatten_leaves,
)
from rlserve.models.spaces import space_from_json

# RLlib's catalog yields these only when the algorithm asks for them (dist_type), e.g.
# SAC's SquashedGaussian, DDPG's Deterministic; a case recording one was built that way.
_EXPLICIT_ONLY = {"TorchSquashedGaussian", "TorchBeta", "TorchDeterministic"}


def _dist_case_names() -> list[str]:
    # Distributions fed by an action head (q_model, autoregressive) are checked in
    # test_action_heads.py: their dist inputs are not model_out.
    return select_cases(
        lambda name: bool(read_meta(name).get("action_dist")) and read_meta(name)["kind"] not in HEAD_KINDS
    )


def _case(name: str) -> OracleCase:
    if name.startswith("<no cases"):
        pytest.fail(f"no oracle cases with an action_dist found (looked in {oracle_dirs_text()})")
    return load_case(name)


def _spec(case: OracleCase) -> ActionDistSpec:
    meta = case.meta
    recorded = meta["action_dist"]
    space = space_from_json(meta["action_space"])
    if recorded["class"] in _EXPLICIT_ONLY:
        extra = {k: v for k, v in recorded.get("kwargs", {}).items() if k in ("low", "high")}
        return get_action_dist(space, meta["model_config"], dist_type=recorded["class"], dist_kwargs=extra)
    return get_action_dist(space, meta["model_config"])


def _strip(node: dict[str, Any]) -> dict[str, Any]:
    """A dist JSON reduced to what both sides record: class and kwargs (children too)."""
    kwargs = dict(node.get("kwargs", {}))
    if "child_distributions" in kwargs:
        kwargs["child_distributions"] = [_strip(c) for c in kwargs["child_distributions"]]
    if "input_lens" in kwargs:
        kwargs["input_lens"] = [int(n) for n in kwargs["input_lens"]]
    return {"class": node["class"], "kwargs": kwargs}


@pytest.mark.parametrize("name", _dist_case_names())
def test_catalog_choice(name: str) -> None:
    case = _case(name)
    spec = _spec(case)
    assert spec.num_outputs == case.meta["num_outputs"]
    assert _strip(spec.to_json()) == _strip(case.meta["action_dist"])
    assert ActionDistSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    if case.meta["action_dist"]["class"] in _EXPLICIT_ONLY:
        # Without dist_type the catalog must not pick the explicit-only class.
        default = get_action_dist(space_from_json(case.meta["action_space"]), case.meta["model_config"])
        assert default.name != case.meta["action_dist"]["class"]
    mark_fields(case, "action_dist", "num_outputs")


def _prefixes(case: OracleCase) -> list[tuple[str, np.ndarray, dict[str, str]]]:
    """(io prefix, dist inputs (B, N), RLlib's recorded errors) for dist/ and probe/dist/."""
    out = []
    if case.keys_under("dist"):
        inputs = case.io["model_out"]
        out.append(("dist", inputs.reshape(-1, inputs.shape[-1]), case.meta.get("dist_errors", {})))
    if case.keys_under("probe/dist"):
        out.append(("probe/dist", case.io["probe/dist_inputs"], case.meta.get("probe_dist_errors", {})))
    return out


def _leading(case: OracleCase, prefix: str) -> int:
    """How many leading axes to merge into the batch: [T, B] for recurrent model_out."""
    return case.io["model_out"].ndim - 1 if prefix == "dist" else 1


def _tree(case: OracleCase, key: str, lead: int) -> dict[str, np.ndarray]:
    return {p: v.reshape((-1, *v.shape[lead:])) for p, v in case.tree(key).items()}


def _structured(space: Any, tree: dict[str, np.ndarray]) -> Any:
    paths = [path_str(p) for p in leaf_paths(space)]
    assert sorted(paths) == sorted(tree), f"leaf paths {paths} != recorded {sorted(tree)}"
    return unflatten_leaves(space, [tree[p] for p in paths])


def _by_path(space: Any, value: Any) -> dict[str, np.ndarray]:
    return {path_str(p): np.asarray(v) for p, v in zip(leaf_paths(space), flatten_leaves(space, value), strict=True)}


def _action_sets(case: OracleCase, prefix: str) -> list[str]:
    sets = {k[len(prefix) + len("/actions/"):].split("/")[0] for k in case.keys_under(f"{prefix}/actions")}
    return sorted(sets)


@pytest.mark.parametrize("name", _dist_case_names())
def test_distribution_outputs(name: str) -> None:
    case = _case(name)
    spec = _spec(case)
    space = space_from_json(case.meta["action_space"])
    prefixes = _prefixes(case)
    assert prefixes, f"{name}: case has an action_dist but no dist/ or probe/dist/ keys"
    for prefix, inputs, errors in prefixes:
        lead = _leading(case, prefix)
        dist = spec.build(inputs)
        mode = _by_path(space, dist.deterministic_sample())
        if prefix != "dist":  # model_out is an output, compared by the model tests
            mark_io(case, "probe/dist_inputs")
        for path, expected in _tree(case, f"{prefix}/deterministic_sample", lead).items():
            assert_close(mode[path], expected, f"{prefix}/deterministic_sample/{path}")
            mark_io(case, f"{prefix}/deterministic_sample" + (f"/{path}" if path else ""))
        if f"{prefix}/entropy" in case.io:
            entropy = case.io[f"{prefix}/entropy"]
            assert_close(dist.entropy(), entropy.reshape((-1, *entropy.shape[lead:])), f"{prefix}/entropy")
            mark_io(case, f"{prefix}/entropy")
        if f"{prefix}/logp_each_action" in case.io:
            each = case.io[f"{prefix}/logp_each_action"]
            assert_close(dist.logp_each_action(), each.reshape(-1, each.shape[-1]), f"{prefix}/logp_each_action")
            mark_io(case, f"{prefix}/logp_each_action")
        if f"{prefix}/sampled_action_logp" in case.io:
            dist.deterministic_sample()
            recorded = case.io[f"{prefix}/sampled_action_logp"].reshape(-1)
            assert_close(dist.sampled_action_logp(), recorded, f"{prefix}/sampled_action_logp")
            mark_io(case, f"{prefix}/sampled_action_logp")
        for set_name in _action_sets(case, prefix):
            _check_action_set(case, prefix, set_name, lead, space, dist, errors)
        _check_recorded_errors(case, prefix, lead, space, spec.build(inputs), errors)


def _check_recorded_errors(case, prefix, lead, space, dist, errors) -> None:
    """Every method RLlib failed on must raise our DistributionError, none may pass silently."""
    calls = {"entropy": dist.entropy}
    for set_name in _action_sets(case, prefix):
        actions = _structured(space, _tree(case, f"{prefix}/actions/{set_name}", lead))
        calls[f"logp[{set_name}]"] = lambda a=actions: dist.logp(a)
        calls[f"logp_flat[{set_name}]"] = lambda a=actions: dist.logp(flatten_actions(space, a))
    unknown = sorted(set(errors) - set(calls))
    assert not unknown, f"{prefix}: RLlib errors this test cannot replay: {unknown}"
    for method in errors:
        with pytest.raises(DistributionError):
            calls[method]()
        if method.startswith("logp"):  # the recorded actions were this call's input
            mark_io(case, *case.keys_under(f"{prefix}/actions/{method.split('[')[1].rstrip(']')}"))
    mark_fields(case, "dist_errors" if prefix == "dist" else "probe_dist_errors")


def _check_action_set(case, prefix, set_name, lead, space, dist, errors) -> None:
    actions = _structured(space, _tree(case, f"{prefix}/actions/{set_name}", lead))
    what = f"{prefix}/logp/{set_name}"
    if what in case.io:
        assert_close(dist.logp(actions), case.io[what].reshape(-1), what)
        mark_io(case, what, *case.keys_under(f"{prefix}/actions/{set_name}"))
    flat_key = f"{prefix}/actions_flat/{set_name}"
    if flat_key in case.io:
        flat = flatten_actions(space, actions)
        assert flat.dtype == np.float32
        assert_close(flat, case.io[flat_key], flat_key)
        mark_io(case, flat_key, *case.keys_under(f"{prefix}/actions/{set_name}"))
        logp_flat = f"{prefix}/logp_flat/{set_name}"
        if logp_flat in case.io:
            assert_close(dist.logp(case.io[flat_key].astype(np.float32)), case.io[logp_flat], logp_flat)
            mark_io(case, logp_flat)


@pytest.mark.parametrize("name", _dist_case_names())
def test_samples_lie_in_support_and_are_reproducible(name: str) -> None:
    case = _case(name)
    spec = _spec(case)
    space = space_from_json(case.meta["action_space"])
    for prefix, inputs, errors in _prefixes(case):
        lead = _leading(case, prefix)
        recorded = _tree(case, f"{prefix}/actions/dist_sample", lead)
        dist = spec.build(inputs)
        first = _by_path(space, dist.sample(np.random.default_rng(7)))
        again = _by_path(space, spec.build(inputs).sample(np.random.default_rng(7)))
        for path, expected in recorded.items():
            assert first[path].shape == expected.shape, f"{prefix} sample '{path}' shape"
            assert first[path].dtype.kind == expected.dtype.kind, f"{prefix} sample '{path}' dtype"
            np.testing.assert_array_equal(first[path], again[path])
        if not any(k.startswith("logp") for k in errors):
            logp = dist.logp(_structured(space, first))
            assert np.all(np.isfinite(logp)), f"{prefix}: logp of own samples {logp}"
            np.testing.assert_array_equal(dist.sampled_action_logp(), logp)
        for leaf, path in zip(leaf_spaces(space), leaf_paths(space), strict=True):
            _assert_in_support(leaf, first[path_str(path)], spec)


def _assert_in_support(leaf: Any, values: np.ndarray, spec: ActionDistSpec) -> None:
    import gymnasium.spaces as gs

    if isinstance(leaf, gs.Discrete):
        assert np.all((values >= 0) & (values < leaf.n))
    elif isinstance(leaf, gs.MultiDiscrete):
        assert np.all((values >= 0) & (values < leaf.nvec))
    elif isinstance(leaf, gs.Box) and np.dtype(leaf.dtype).kind == "i":
        span = int(np.max(leaf.high)) - int(np.min(leaf.low))
        assert np.all((values >= 0) & (values <= span))
    elif spec.name == "TorchDirichlet":
        assert np.all(values >= 0) and np.allclose(values.sum(-1), 1.0, atol=1e-5)
    elif spec.name in ("TorchSquashedGaussian", "TorchBeta"):
        low, high = spec.kwargs.get("low", -1.0 if "Squashed" in spec.name else 0.0), spec.kwargs.get("high", 1.0)
        assert np.all((values >= low) & (values <= high))
    else:
        assert np.all(np.isfinite(values))


def _mask_case_names() -> list[str]:
    names = []
    for name in _dist_case_names():
        if name.startswith("<no cases"):
            continue
        case = load_case(name)
        if "model_out_unmasked" in case.io and "obs/action_mask" in case.io:
            names.append(name)
    return names


@pytest.mark.parametrize("name", _mask_case_names())
def test_action_mask_matches_rllib_example(name: str) -> None:
    case = _case(name)
    masked = apply_action_mask(case.io["model_out_unmasked"], case.io["obs/action_mask"], _spec(case))
    assert_close(masked, case.io["model_out"], "masked logits")
    mark_io(case, "model_out_unmasked", "obs/action_mask", "model_out")
