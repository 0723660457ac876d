"""Request normalisation (single vs batch form) and settings from the environment."""

from __future__ import annotations

import msgspec
import pytest
from pydantic import ValidationError

from rlserve.service.act.wire import decode_request, to_rows
from rlserve.service.errors import BadRequest, InvalidInput, InvalidJSON
from rlserve.service.settings import NOT_SETTINGS, Settings, UnknownSetting


def rows_of(payload) -> object:
    return to_rows(decode_request(msgspec.json.encode(payload)), Settings().max_rows)


def test_single_form_becomes_one_row():
    rows = rows_of({"observation": [1, 2], "session_id": "s", "reward": 1.5, "episode_start": True})
    assert rows.single and len(rows) == 1
    assert rows.session_ids == ["s"] and rows.rewards == [1.5] and rows.episode_starts == [True]


def test_batch_form_columns_default_per_row():
    rows = rows_of({"observations": [[1], [2], [3]], "session_ids": ["a", None, "c"]})
    assert not rows.single and len(rows) == 3
    assert rows.rewards == [None] * 3 and rows.episode_starts == [False] * 3


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "observation"),
        ({"observation": [1], "observations": [[1]]}, "observation"),
        ({"observations": []}, "observations"),
        ({"observation": [1], "rewards": [1.0]}, "rewards"),
        ({"observations": [[1]], "reward": 1.0}, "reward"),
        ({"observation": [1], "bogus": 1}, "bogus"),
        ({"observation": [1], "explore": "yes"}, "explore"),
        ({"observation": [1], "outputs": ["everything"]}, "outputs[0]"),
        ({"observation": [1], "seed": -1}, "seed"),
        ({"observations": [[1]], "seeds": [-1]}, "seeds[0]"),
    ],
)
def test_malformed_requests_are_400_naming_the_field(payload, field):
    with pytest.raises(BadRequest) as info:
        rows_of(payload)
    assert info.value.status == 400 and info.value.field == field


@pytest.mark.parametrize("column", ["session_ids", "rewards", "episode_starts", "terminateds"])
def test_a_per_row_list_of_another_length_is_422_naming_it(column):
    """Schema-valid JSON whose lists do not fit together: the input does not fit (422)."""
    value = {"session_ids": None, "rewards": 1.0}.get(column, True)
    with pytest.raises(InvalidInput) as info:
        rows_of({"observations": [[1], [2]], column: [value]})
    assert info.value.status == 422 and info.value.field == column
    assert info.value.expected == 2 and info.value.received == 1


def test_invalid_json_is_its_own_error():
    with pytest.raises(InvalidJSON):
        decode_request(b"{not json")
    with pytest.raises(InvalidJSON, match="nested too deeply"):
        decode_request(b'{"observation": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(InvalidJSON):
        decode_request(b"")


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RLSERVE_MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("RLSERVE_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("RLSERVE_ADMIN_TOKEN", "")
    monkeypatch.setenv("RLSERVE_RUNTIME", "torchscript")
    s = Settings()
    assert s.max_batch_size == 32 and s.repository == tmp_path.resolve()
    assert s.admin_token is None  # empty means unset, never the empty password
    assert s.runtime == "torchscript"


def test_settings_name_valid_choices():
    with pytest.raises(ValidationError, match="onnx"):
        Settings(runtime="tensorrt")
    with pytest.raises(ValidationError):
        Settings(max_batch_size=0)
    with pytest.raises(ValidationError):
        Settings(no_such_setting=1)


def test_an_unknown_rlserve_variable_fails_naming_the_closest_setting(monkeypatch):
    monkeypatch.setenv("RLSERVE_MAX_BATCH_SIZ", "8")
    with pytest.raises(UnknownSetting, match="RLSERVE_MAX_BATCH_SIZ in the environment: did you mean "
                                             "RLSERVE_MAX_BATCH_SIZE[?]"):
        Settings()
    monkeypatch.delenv("RLSERVE_MAX_BATCH_SIZ")
    monkeypatch.setenv("rlserve_prot", "9000")  # read case-insensitively, so checked so too
    with pytest.raises(UnknownSetting, match="did you mean RLSERVE_PORT[?]"):
        Settings()
    monkeypatch.delenv("rlserve_prot")
    monkeypatch.setenv("RLSERVE_REPLICAS", "2")  # replicas are separate servers, not a setting
    with pytest.raises(UnknownSetting, match="no setting has a similar name; the settings are .*RLSERVE_PORT"):
        Settings()
    monkeypatch.delenv("RLSERVE_REPLICAS")
    for name in NOT_SETTINGS:  # the project's other tools read these: not typos
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("RLSERVE_MAX_UNPACKED_BYTES", "4096")
    assert Settings().max_unpacked_bytes == 4096
