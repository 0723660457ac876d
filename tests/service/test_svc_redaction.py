"""The last guard on error bodies: server directories a message might still quote are rewritten."""

from __future__ import annotations

import sys
from pathlib import Path

from rlserve.service.errors import BundleInvalid
from rlserve.service.redaction import PathRedactor


def test_server_directories_are_rewritten_in_every_text_part(tmp_path: Path) -> None:
    temp, repo, package = tmp_path / "tmp", tmp_path / "tmp" / "repo", tmp_path / "site" / "rlserve"
    redact = PathRedactor(repo, package, temp=temp, python=tmp_path / "venv")
    exc = BundleInvalid(
        f"Load model from {temp}/rlsb-a1_b2/model.onnx failed; see {repo}/box/manifest.json and '{repo}' "
        f"and {temp}/upload-xyz.rlsb and {temp}/other/file and {package}/service/x.py and {tmp_path}/venv/lib",
        expected=[f"{repo}/a", {"k": f"{temp}/rlsb-q"}], received=f"{temp}")
    body = redact(exc).to_json()["error"]
    assert body["message"] == ("Load model from model.onnx failed; see box/manifest.json and 'the model repository' "
                               "and the uploaded archive and <temp> and <package> and <python>")
    assert body["expected"] == ["a", {"k": "the unpacked bundle"}] and body["received"] == "<temp>"


def test_other_text_is_left_alone(tmp_path: Path) -> None:
    redact = PathRedactor(tmp_path / "repo", tmp_path / "pkg", temp=tmp_path / "t", python=Path(sys.prefix))
    text = f"no route POST /v1/models/box/act; {tmp_path}/tmpfoo and {tmp_path / 't'}x stay"
    assert redact(BundleInvalid(text)).message == text
