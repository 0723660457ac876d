"""docker/kubernetes/ renders and validates without a cluster (scripts/check_kubernetes.py).

Every kustomization (base, overlays, KServe) is rendered with kubectl's kustomize and
checked against the Kubernetes OpenAPI schemas kubernetes-validate ships and against the
kserve SDK's models: tests/unit/test_kubernetes_doc.py runs the whole check as
docs/kubernetes.md shows it. Here the checks are shown to fail on an error of each kind.

The KServe checks import the kserve SDK, which cannot share a process with
tritonclient.grpc (both register the protocol's protobuf messages), so they run in the
script's own process, as CI and docs/kubernetes.md run it.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_kubernetes.py"
sys.path.insert(0, str(REPO / "scripts"))

from check_kubernetes import (  # noqa: E402
    KUBERNETES_VERSIONS,
    MANIFESTS,
    cross_references,
    kubernetes_problems,
    kustomizations,
    render,
)


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return render(MANIFESTS / "base")


def _one(docs: list[dict], kind: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def test_there_is_a_base_overlays_and_kserve():
    names = {str(p.relative_to(MANIFESTS)) for p in kustomizations()}
    assert {"base", "kserve", "overlays/gpu", "overlays/external-redis", "overlays/queue-hpa"} <= names


def test_the_base_holds_what_the_service_needs(base):
    kinds = sorted(d["kind"] for d in base)
    assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim",
                     "PodDisruptionBudget", "Service", "Service", "StatefulSet"]


def _pod(d: dict) -> dict:
    return d["spec"]["template"]["spec"]


@pytest.mark.parametrize("break_it, expected", [
    (lambda d: _pod(d).update(terminationGracePeriodSeconds="40"), "is not of type 'integer'"),
    (lambda d: _pod(d)["containers"][0].update(livenessprobe={}), "'livenessprobe' was unexpected"),
    (lambda d: _pod(d)["containers"][0].pop("name"), "'name' is a required property"),
    (lambda d: d["spec"]["strategy"].update(type="Recreate", rollingUpdate=None), None),  # valid: a control
])
def test_a_kubernetes_schema_error_is_caught(base, break_it, expected):
    deployment = copy.deepcopy(_one(base, "Deployment"))
    break_it(deployment)
    found = kubernetes_problems(deployment)
    if expected is None:
        assert found == []
    else:
        assert len(found) == len(KUBERNETES_VERSIONS) and all(expected in f for f in found), found


def test_a_broken_reference_is_caught(base):
    docs = copy.deepcopy(base)
    service = next(d for d in docs if d["metadata"]["name"] == "rlserve" and d["kind"] == "Service")
    service["spec"]["ports"][1]["targetPort"] = "grcp"
    _one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] = "rlserv"
    _one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "rl"
    docs.remove(_one(docs, "PersistentVolumeClaim"))
    found = " | ".join(cross_references(docs))
    for expected in ("targets 'grcp'", "scales Deployment/rlserv,", "PodDisruptionBudget/rlserve: its selector",
                     "claims rlserve-models, which is not rendered"):
        assert expected in found


def test_a_kserve_schema_error_is_caught(tmp_path):
    """Each broken copy of the KServe resources is reported, by the script's own process."""
    runtime, service = (_one(render(MANIFESTS / "kserve"), kind) for kind in ("ServingRuntime", "InferenceService"))
    broken = {
        "unknown-field": (service, lambda d: d["spec"]["predictor"]["model"].update(storageURI="pvc://x")),
        "wrong-type": (service, lambda d: d["spec"]["predictor"].update(minReplicas="2")),
        "missing-required": (service, lambda d: d["spec"]["predictor"]["model"].pop("modelFormat")),
        "kubernetes-type-inside": (runtime, lambda d: d["spec"]["containers"][0]["ports"][0].update(port=1)),
        "container-without-name": (runtime, lambda d: d["spec"]["containers"][0].pop("name")),
    }
    docs = []
    for name, (original, break_it) in broken.items():
        doc = copy.deepcopy(original)
        doc["metadata"]["name"] = name
        break_it(doc)
        docs.append(doc)
    rendered = tmp_path / "broken.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    proc = run_script("--rendered", str(rendered))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    problems = proc.stderr
    assert f"{len(broken)} problem(s)" in problems, problems
    assert "InferenceService/unknown-field: spec.predictor.model.storageURI: no such field" in problems
    assert "InferenceService/wrong-type: spec.predictor.minReplicas: expected int, got str" in problems
    assert "InferenceService/missing-required: " in problems and "model_format" in problems
    assert "ServingRuntime/kubernetes-type-inside: spec.containers[0].ports[0].port: no such field" in problems
    assert "ServingRuntime/container-without-name: " in problems


@pytest.mark.parametrize("hidden", [["kubernetes_validate"], ["yaml", "kserve"]])
def test_without_the_test_extra_the_script_says_so_in_one_line(hidden: list[str]) -> None:
    """Run as `python scripts/check_kubernetes.py` where those packages cannot be imported."""
    wrapper = ("import runpy, sys\n"
               f"for name in {hidden!r}: sys.modules[name] = None\n"
               f"sys.argv = [{str(SCRIPT)!r}]\n"
               f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", wrapper], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"check_kubernetes.py: needs the [test] extra (pip install -e '.[test]'); not installed: "
                           f"{', '.join(hidden)}\n")
