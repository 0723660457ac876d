"""Preprocessors against RLlib's recorded preprocessing.

Cases are chosen by content: every case whose io.npz holds raw observations (``obs`` or
``obs/...``). The observation space is rebuilt from case.json, the preprocessor chosen
under the case's ``model_config``, and its description, columnar output, per-row output
and the model's observation space compared with what RLlib recorded.
"""

from __future__ import annotations

import itertools

import pytest
from oracle import (
    OracleCase,
    assert_close,
    catalog_config,
    io_key_names,
    load_case,
    oracle_dirs_text,
    select_cases,
)
from unit.space_catalog import row_from_columns

from conformance.keys_checked import mark_fields, mark_io
from rlserve.models.preprocessors import get_preprocessor
from rlserve.models.spaces import space_from_json, space_to_json


def _obs_case_names() -> list[str]:
    return select_cases(lambda name: any(k == "obs" or k.startswith("obs/") for k in io_key_names(name)))


@pytest.fixture(params=_obs_case_names())
def case(request) -> OracleCase:
    if request.param.startswith("<no cases"):
        pytest.fail(f"no oracle cases with raw observations (looked in {oracle_dirs_text()})")
    return load_case(request.param)


def _preprocessor(case: OracleCase):
    space = space_from_json(case.meta["observation_space"])
    return space, get_preprocessor(space, catalog_config(case.meta))


def test_description_matches_rllib(case: OracleCase) -> None:
    _, prep = _preprocessor(case)
    expected = case.meta["preprocessor"]
    assert prep.name == expected["class"]
    assert list(prep.output_shape) == expected["output_shape"]
    assert prep.output_dtype.name == expected["output_dtype"]
    assert prep.size == expected["size"]
    assert prep.layout == expected["layout"]
    if "options" in expected:  # the fixtures-next recorder leaves it out
        assert prep.options == expected["options"]
    fields = [k for k in ("class", "output_shape", "output_dtype", "size", "options", "layout") if k in expected]
    mark_fields(case, *(f"preprocessor.{k}" for k in fields))


def test_columnar_batch_matches_obs_flat(case: OracleCase) -> None:
    _, prep = _preprocessor(case)
    out = prep.transform_columns(case.tree("obs"))
    expected = case.io["obs_flat"]
    assert out.dtype == expected.dtype, f"dtype {out.dtype} != RLlib's {expected.dtype}"
    assert_close(out, expected, f"{case.name} obs_flat")
    mark_io(case, "obs_flat", *case.keys_under("obs"))


def test_each_row_matches_obs_flat(case: OracleCase) -> None:
    space, prep = _preprocessor(case)
    columns = case.tree("obs")
    expected = case.io["obs_flat"]
    lead = expected.shape[: expected.ndim - len(prep.output_shape)]
    assert lead, "obs_flat must have at least one batch axis"
    for index in itertools.product(*(range(n) for n in lead)):
        out = prep.transform(row_from_columns(space, columns, index))
        assert out.dtype == expected.dtype
        assert_close(out, expected[index], f"{case.name} row {index}")


def test_model_observation_space_matches(case: OracleCase) -> None:
    _, prep = _preprocessor(case)
    recorded = dict(case.meta["model_obs_space"])
    has_original = recorded.pop("has_original_space")
    given = prep.observation_space
    assert space_to_json(given) == recorded
    assert hasattr(given, "original_space") == has_original
    if has_original:
        assert space_to_json(given.original_space) == case.meta["observation_space"]
    mark_fields(case, "model_obs_space")
