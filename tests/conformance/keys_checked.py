"""Which io.npz keys and case.json fields the conformance tests compared, per oracle case.

The contract (shared/oracle/check_format.md) is only as strong as the keys that some test
compares. Two guards keep a key from going unchecked:

- statically, ``KEY_RULES`` names every *kind* of io key the format defines and the test
  that compares it; a key that matches no rule (a new kind of output) fails
  ``test_coverage.py`` whatever subset of tests runs;
- dynamically, every conformance test calls ``mark_io`` / ``mark_fields`` right after a
  comparison passed (inputs count when they were fed, action sets when they were used as
  logp inputs), and ``test_coverage.py``'s last test asserts, after a full run of
  tests/conformance, that the marks cover every key and behavioural field of every case.

The registry is a module-level dict: pytest runs the tests in one process (no xdist here),
and every test module imports this module under the same name (``conformance.keys_checked``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

__all__ = [
    "BEHAVIOUR_FIELDS",
    "INFORMATIONAL_FIELDS",
    "KEY_RULES",
    "checked_fields",
    "checked_io",
    "field_present",
    "mark_fields",
    "mark_io",
    "rule_for",
]

# (pattern over io keys, the test that compares such a key). ``P`` = optional "probe/".
_P = r"(probe/)?"
KEY_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), owner)
    for p, owner in [
        (r"obs(/.+)?", "test_preprocessing (fed to the preprocessor)"),
        (r"obs_flat", "test_preprocessing (compared), test_models/test_recurrent (fed)"),
        (r"model_out|value", "test_models / test_recurrent / test_export"),
        (r"model_out_unmasked", "test_models, test_distributions (action mask)"),
        (_P + r"dist/deterministic_sample(/.+)?", "test_distributions"),
        (_P + r"dist/(entropy|logp_each_action|sampled_action_logp)", "test_distributions"),
        (_P + r"dist/actions/[^/]+(/.+)?", "test_distributions (logp inputs)"),
        (_P + r"dist/(logp|actions_flat|logp_flat)/[^/]+", "test_distributions"),
        (r"probe/dist_inputs", "test_distributions (fed)"),
        (r"state_(in|out)/\d+", "test_recurrent / test_export"),
        (r"prev_actions|prev_rewards", "test_recurrent (fed), test_session_inputs (rebuilt)"),
        (r"actions_taken(/.+)?|rewards|seq_lens", "test_session_inputs, test_trajectory_view"),
        (r"prev_n_(obs|actions|rewards)", "test_trajectory_view"),
        (r"seqmode/(model_out|value|state_out/\d+)", "test_recurrent (sequence mode)"),
        (r"stream|stream_filtered|running_(mean|std|n)|frozen_(in|out)|one_push/out_frozen", "test_filter"),
        (r"final/(num_pushes|mean_array|sum_sq_diff_array|var|std)", "test_filter"),
        (r"q_values|q_logits|advantages|state_value|base_value|greedy_action", "test_action_heads (q_model)"),
        (r"a1_logits|a2_logits/a1=\d+|a2_logits_given_a1", "test_action_heads (autoregressive)"),
        (r"dist/(sample(/.+)?|logp|deterministic_sampled_action_logp)", "test_action_heads (autoregressive)"),
    ]
]

# case.json fields (dotted paths) that carry behaviour: when a case has one, some test must
# compare our behaviour with it and mark it.
BEHAVIOUR_FIELDS: tuple[str, ...] = (
    "model_class",
    "num_outputs",
    "model_num_outputs",
    "action_dist",
    "dist_errors",
    "probe_dist_errors",
    "preprocessor.class",
    "preprocessor.output_shape",
    "preprocessor.output_dtype",
    "preprocessor.size",
    "preprocessor.options",
    "preprocessor.layout",
    "model_obs_space",
    "model_config",
    "model_config_overrides",
    "state",
    "batch_size",
    "T",
    "filter",
    "dqn_config",
    "io_keys",
    "weights.shapes",
    "weights.aliased_keys",
    "weights.buffer_keys",
    "weights.unreached_keys",
    "weights.num_keys",
    "weights.num_unique_tensors",
    "weights.num_parameters_unique",
)

# Fields that describe the recording rather than behaviour (or are inputs every test reads:
# the spaces). A top-level field in neither list fails test_coverage.py: someone must decide.
INFORMATIONAL_FIELDS: tuple[str, ...] = (
    "format_version",
    "case",
    "kind",
    "description",
    "seed",
    "versions",
    "torch_num_threads",
    "observation_space",
    "action_space",
    "notes",
    "size_note",
    "model_class_mro",  # model_class is compared; the MRO only explains it
    "seqmode_max_abs_diff",  # RLlib's own step/sequence drift; seqmode/* keys are compared
    "weights",  # container: its behavioural sub-fields are listed above
    "preprocessor",  # container, likewise
    "weights.init",  # how the fixture's weights were made (prose)
    "weights.init_stats",  # statistics of RLlib's untouched init (serving loads weights)
)

_IO: defaultdict[str, set[str]] = defaultdict(set)
_FIELDS: defaultdict[str, set[str]] = defaultdict(set)


def _case_id(case: Any) -> str:
    # The folder path, not the name: two folders may hold cases of the same name.
    return str(case.path)


def rule_for(key: str) -> str | None:
    """The test that compares io key ``key``, or None for a kind of key the format lacks."""
    for pattern, owner in KEY_RULES:
        if pattern.fullmatch(key):
            return owner
    return None


def mark_io(case: Any, *keys: str) -> None:
    """Record that io keys ``keys`` of ``case`` were compared (or fed) and matched."""
    unknown = [k for k in keys if k not in case.io]
    assert not unknown, f"{case.name}: marked io keys that the case lacks: {unknown}"
    _IO[_case_id(case)].update(keys)


def field_present(meta: dict[str, Any], dotted: str) -> bool:
    node: Any = meta
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def mark_fields(case: Any, *fields: str) -> None:
    """Record that case.json fields (dotted paths) of ``case`` were compared and matched."""
    unknown = [f for f in fields if not field_present(case.meta, f)]
    assert not unknown, f"{case.name}: marked case.json fields that the case lacks: {unknown}"
    _FIELDS[_case_id(case)].update(fields)


def checked_io(case: Any) -> set[str]:
    return set(_IO.get(_case_id(case), ()))


def checked_fields(case: Any) -> set[str]:
    return set(_FIELDS.get(_case_id(case), ()))
