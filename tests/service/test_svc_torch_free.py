"""Serving ONNX bundles never imports torch (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, json, sys
import httpx
from rlserve.service.app import create_app
from rlserve.service.settings import Settings

async def main():
    app = create_app(Settings(repository=sys.argv[1], runtime=sys.argv[2]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r1 = await c.post("/v1/models/lstm/act", json={"observation": [0.1, 0.2, 0.3, 0.4], "session_id": "s",
                                                       "episode_start": True, "outputs": ["value", "entropy"]})
        r2 = await c.post("/v1/models/mlp/act", json={"observations": [[0, 0, 0, 0]] * 3, "explore": False})
        meta = await c.get("/v1/models/mlp")
    print(json.dumps({"status": [r1.status_code, r2.status_code], "runtime": meta.json()["runtime"]["kind"],
                      "torch": "torch" in sys.modules}))

asyncio.run(main())
"""


def _serve(repo: Path, runtime: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(repo), runtime], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_onnx_serving_does_not_import_torch(make_repo):
    result = _serve(make_repo("mlp", "lstm"), "onnx")
    assert result == {"status": [200, 200], "runtime": "onnx", "torch": False}


def test_the_check_can_fail_torchscript_imports_torch(make_repo):
    result = _serve(make_repo("mlp", "lstm"), "auto")
    assert result["runtime"] == "onnx" and result["torch"] is False
    repo = make_repo("mlp")
    result = _serve(repo, "torchscript")
    assert result["torch"] is True and result["runtime"] == "torchscript"


BLOCKED = r"""
import sys, json
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoTorch())
from rlserve.service.errors import BundleInvalid
from rlserve.service.serving.checkpoints import _export
try:
    _export(__import__("pathlib").Path(sys.argv[1]), __import__("pathlib").Path(sys.argv[2]), "m", None)
except BundleInvalid as exc:
    print(json.dumps({"refused": exc.message}))
"""


def test_a_checkpoint_without_torch_is_refused_as_a_bundle_it_cannot_export(tmp_path: Path) -> None:
    """Every import the export needs sits inside the refusal's guard: without torch the
    answer is the 'needs torch' refusal, not a ModuleNotFoundError from the exporter."""
    checkpoint = ROOT.parent / "shared" / "oracle" / "checkpoints" / "ppo_cartpole_fc_filter"
    assert checkpoint.is_dir(), checkpoint
    out = subprocess.run([sys.executable, "-c", BLOCKED, str(checkpoint), str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    refused = json.loads(out.stdout.strip().splitlines()[-1])["refused"]
    assert "needs torch to export it (torch is not installed)" in refused
