"""A repository holding hostile bundles next to a good one: `rlserve serve` starts, lists
each hostile bundle under ``failed_to_load`` with why, and serves the good one; an upload
of the same through the admin API is a 422 and the server keeps serving.

Each hostile bundle is the embedded cartpole bundle with one thing wrong and its
checksums written again. A ``model.onnx`` that is no ONNX (ONNX Runtime raises its own
``InvalidProtobuf``) once made the start exit with status 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bundle_edits import archive, edited_copy
from plain_http import HTTP
from server_process import REPO, running_server

pytestmark = pytest.mark.e2e

CARTPOLE = REPO / "service" / "default_models" / "cartpole"
TOKEN = "hostile-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def hostile(out: Path, edit=None, files: dict[str, bytes] | None = None) -> Path:
    return edited_copy(CARTPOLE, out, edit, files)


def _obs5(m: dict) -> None:
    m["observation_space"].update(shape=[5], low=[-1.0] * 5, high=[1.0] * 5)
    m["signature"]["obs_shape"] = [5]


def test_hostile_bundles_in_the_repository_fail_alone(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(CARTPOLE, repo / "cartpole")
    hostile(repo / "garbage", files={"model.onnx": b"not an onnx file"})
    hostile(repo / "obs5", edit=_obs5)
    hostile(repo / "slashed", edit=lambda m: m.update(name="a/b"))
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_EXPORT_CACHE": str(tmp_path / "cache")}
    with running_server(["--repository", str(repo)], env=env) as url:
        ready = HTTP.get(f"{url}/readyz").json()
        failed = ready["failed_to_load"]
        assert sorted(failed) == ["garbage", "obs5", "slashed"], ready
        assert "model.onnx" in failed["garbage"] and "INVALID_PROTOBUF" in failed["garbage"]
        assert "'obs'" in failed["obs5"] and "[5]" in failed["obs5"]
        assert "'name'" in failed["slashed"] and "'a/b'" in failed["slashed"]
        assert str(repo) not in json.dumps(failed)
        r = HTTP.post(f"{url}/v1/models/cartpole/act", json={"observation": [0.0, 0.1, 0.0, -0.1]})
        assert r.status_code == 200 and r.json()["version"] == "1", r.text

        # The same bundles uploaded to the running server: refused, and it keeps serving.
        for tag, field in (("garbage", "body"), ("obs5", "body"), ("slashed", "name")):
            r = HTTP.post(f"{url}/v1/admin/models", content=archive(repo / tag), timeout=60,
                           headers={**AUTH, "Content-Type": "application/octet-stream"})
            error = r.json()["error"]
            assert r.status_code == 422 and error["code"] == "bundle_invalid" and error["field"] == field, r.text
        listed = HTTP.get(f"{url}/v1/admin/models", headers=AUTH).json()["models"]
        assert [(m["name"], m["version"]) for m in listed] == [("cartpole", "1")]
        assert HTTP.get(f"{url}/readyz").status_code == 200
        r = HTTP.post(f"{url}/v1/models/cartpole/act", json={"observation": [0.0, 0.1, 0.0, -0.1]})
        assert r.status_code == 200, r.text
