"""The manifests of docker/kubernetes/ use the names the server really has.

Every fact on the server's side is read from the code or the running app, never listed
here: the settings (their environment names and validation: ``Settings`` itself), the
GET routes of ``create_app``, the metric names on its ``/metrics`` after a request, the
image's user id from the Dockerfiles. Each check returns the problems it finds, so the
tests below also show that a manifest with a wrong name is caught.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rlserve.service.app import create_app
from rlserve.service.settings import PREFIX, Settings, UnknownSetting, check_environment

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from check_kubernetes import MANIFESTS, kustomizations, pod_template, render  # noqa: E402

Doc = dict[str, Any]
# Seconds uvicorn may take, after the drain, to answer what it already read and close the
# batchers and the store: the grace period must leave at least this much after the drain.
IN_FLIGHT_S = 10
# KServe's storage initializer puts the storageUri's contents here (KServe's constant).
KSERVE_MODEL_DIR = "/mnt/models"
# Stand-ins for values that come from Secrets, so the settings they name can be validated.
SECRET_STAND_INS = {"RLSERVE_SESSION_STORE": "rediss://:password@redis.example:6379/0"}
OVERLAYS = [p for p in kustomizations() if p.parent.name == "overlays"]


# --------------------------------------------------------------------------- facts


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    """Every kustomization's resources, by folder relative to docker/kubernetes."""
    return {str(folder.relative_to(MANIFESTS)): render(folder) for folder in kustomizations()}


@pytest.fixture(scope="module")
def server() -> dict[str, Any]:
    """The running app's GET routes (its OpenAPI document) and the metric names it exposes
    after one request."""
    app = create_app(Settings(repository=None))

    async def scrape() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://k8s") as client:
            act = await client.post("/v1/models/cartpole/act", json={"observation": [0.0, 0.1, 0.0, -0.1]})
            assert act.status_code == 200, act.text
            return (await client.get("/metrics")).text

    text = asyncio.run(scrape())
    routes = {path for path, operations in app.openapi()["paths"].items() if "get" in operations}
    metrics = set(re.findall(r"^# TYPE (\w+) ", text, flags=re.M))
    return {"routes": routes, "metrics": metrics}


def image_uid() -> int:
    """The service user's id, from both Dockerfiles (they must agree)."""
    uids = {int(m) for path in (REPO / "Dockerfile", REPO / "docker" / "Dockerfile.gpu")
            for m in re.findall(r"--uid (\d+)", path.read_text())}
    assert len(uids) == 1, f"the Dockerfiles disagree on the user id: {uids}"
    return uids.pop()


# --------------------------------------------------------------------------- helpers


def rlserve_pods(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    """(pod template, rlserve container) of every workload that runs the rlserve image."""
    found = []
    for doc in docs:
        template = pod_template(doc)
        for container in template["spec"]["containers"] if template else []:
            if container["image"].split("/")[-1].startswith("rlserve"):
                found.append((template, container))
    return found


def environment(container: Doc, docs: list[Doc]) -> dict[str, str]:
    """The RLSERVE_* environment the container starts with (envFrom ConfigMaps, then env;
    Secret values replaced by stand-ins)."""
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        env[var["name"]] = var["value"] if "value" in var else SECRET_STAND_INS.get(var["name"], "from-a-secret")
    return env


def settings_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """``Settings`` as the server builds them from exactly this environment."""
    for key in [k for k in os.environ if k.upper().startswith(PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings()


def container_port(container: Doc, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (found,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return found


# --------------------------------------------------------------------------- checks


def probe_problems(container: Doc, settings: Settings, routes: set[str]) -> list[str]:
    found = []
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container.get(kind, {}).get("httpGet")
        if get is None:
            found.append(f"{kind}: missing (or not an HTTP GET)")
            continue
        if get["path"] not in routes:
            found.append(f"{kind}: {get['path']} is no GET route of the server")
        if container_port(container, get["port"]) != settings.port:
            found.append(f"{kind}: port {get['port']} is not RLSERVE_PORT {settings.port}")
    return found


def drain_problems(pod: Doc, container: Doc, settings: Settings) -> list[str]:
    found = []
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < settings.shutdown_drain_s + IN_FLIGHT_S:
        found.append(f"terminationGracePeriodSeconds {grace} < RLSERVE_SHUTDOWN_DRAIN_S "
                     f"{settings.shutdown_drain_s} + {IN_FLIGHT_S} s for what is in flight")
    ready = container["readinessProbe"]
    noticed = ready.get("periodSeconds", 10) * ready.get("failureThreshold", 3)
    if settings.shutdown_drain_s <= 0 or noticed > settings.shutdown_drain_s:
        found.append(f"the readiness probe notices the drain after {noticed} s, "
                     f"RLSERVE_SHUTDOWN_DRAIN_S is {settings.shutdown_drain_s}")
    return found


def filesystem_problems(pod: Doc, container: Doc, settings: Settings, repository: str) -> list[str]:
    found = []
    security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    if security.get("runAsUser") != image_uid() or not security.get("runAsNonRoot"):
        found.append(f"runs as {security.get('runAsUser')}, not as the image's non-root user {image_uid()}")
    if not security.get("readOnlyRootFilesystem"):
        found.append("the root filesystem is writable")
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    tmp = volumes.get(mounts.get("/tmp", ""), {})
    if "emptyDir" not in tmp:
        found.append("no writable emptyDir at /tmp, where uploaded archives unpack (tempfile's directory)")
    if str(settings.repository) != repository:
        found.append(f"RLSERVE_REPOSITORY is {settings.repository}, the model volume is at {repository}")
    return found


def service_link_environment(docs: list[Doc]) -> dict[str, str]:
    """The variables the kubelet adds for each Service with a cluster IP when service links
    are on (the Docker-links names: NAME_SERVICE_HOST, NAME_PORT, NAME_PORT_8000_TCP, ...)."""
    env = {}
    for doc in docs:
        if doc["kind"] != "Service" or doc["spec"].get("clusterIP") == "None":
            continue
        name = doc["metadata"]["name"].upper().replace("-", "_")
        env[f"{name}_SERVICE_HOST"] = "10.0.0.1"
        for i, port in enumerate(doc["spec"]["ports"]):
            proto, number = port.get("protocol", "TCP"), port["port"]
            env[f"{name}_SERVICE_PORT"] = env.get(f"{name}_SERVICE_PORT", str(number))
            if "name" in port:
                env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
            if i == 0:
                env[f"{name}_PORT"] = f"{proto.lower()}://10.0.0.1:{number}"
            stem = f"{name}_PORT_{number}_{proto}"
            env.update({stem: f"{proto.lower()}://10.0.0.1:{number}", f"{stem}_PROTO": proto.lower(),
                        f"{stem}_PORT": str(number), f"{stem}_ADDR": "10.0.0.1"})
    return env


def deployment_problems(docs: list[Doc], server: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Everything the rlserve Deployment(s) of one rendered set must get right."""
    found = []
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for template, container in rlserve_pods(docs):
        pod, annotations = template["spec"], template["metadata"].get("annotations", {})
        env = environment(container, docs)
        try:
            check_environment(env)
            settings = settings_of(env, monkeypatch)
        except (UnknownSetting, ValueError) as exc:
            found.append(f"the environment does not start the server: {exc}")
            continue
        if pod.get("enableServiceLinks", True):
            found.append("service links are on: the kubelet adds RLSERVE_* variables the server refuses")
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        if ports.get("http") != settings.port or ports.get("grpc") != settings.grpc_port:
            found.append(f"container ports {ports} are not RLSERVE_PORT {settings.port} / "
                         f"RLSERVE_GRPC_PORT {settings.grpc_port}")
        if annotations.get("prometheus.io/path") not in server["routes"] or \
                annotations.get("prometheus.io/port") != str(settings.port):
            found.append(f"the Prometheus annotations {annotations} do not name the server's /metrics")
        found += probe_problems(container, settings, server["routes"])
        found += drain_problems(pod, container, settings)
        models = next((m["mountPath"] for m in container["volumeMounts"] if m["name"] == "models"), "")
        found += filesystem_problems(pod, container, settings, models)
        store = settings.session_store or ""
        host = re.match(r"redis://([^:/]+):(\d+)", store)
        if host and not any(p["port"] == int(host[2]) for p in services.get(host[1], {}).get("spec", {}).get(
                "ports", [])) and "rediss://" not in store:
            found.append(f"RLSERVE_SESSION_STORE {store} names no rendered Service and port")
    if not rlserve_pods(docs):
        found.append("no workload runs the rlserve image")
    return found


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("folder", ["base"] + [f"overlays/{p.name}" for p in OVERLAYS])
def test_deployments_use_the_servers_names(folder, rendered, server, monkeypatch):
    assert deployment_problems(rendered[folder], server, monkeypatch) == []


def test_a_wrong_name_is_caught(rendered, server, monkeypatch):
    """Not vacuous: each kind of mismatch in a copy of the base is reported."""
    docs = copy.deepcopy(rendered["base"])
    ((template, container),) = rlserve_pods(docs)
    pod = template["spec"]
    settings_map = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    settings_map["RLSERVE_SHUTDOWN_DRAIN_SECONDS"] = settings_map.pop("RLSERVE_SHUTDOWN_DRAIN_S")
    assert "did you mean RLSERVE_SHUTDOWN_DRAIN_S?" in " ".join(deployment_problems(docs, server, monkeypatch))
    settings_map["RLSERVE_SHUTDOWN_DRAIN_S"] = settings_map.pop("RLSERVE_SHUTDOWN_DRAIN_SECONDS")
    container["livenessProbe"]["httpGet"]["path"] = "/health"
    container["readinessProbe"]["periodSeconds"] = 30
    settings_map["RLSERVE_GRPC_PORT"] = "9000"
    pod["terminationGracePeriodSeconds"] = 15
    pod["enableServiceLinks"] = True
    problems = " | ".join(deployment_problems(docs, server, monkeypatch))
    for expected in ("/health is no GET route", "notices the drain after 60 s", "RLSERVE_GRPC_PORT 9000",
                     "terminationGracePeriodSeconds 15", "service links are on"):
        assert expected in problems


def test_service_links_would_stop_the_server(rendered):
    """Why every rlserve pod turns service links off: the `rlserve` Service alone makes the
    kubelet add RLSERVE_SERVICE_HOST and the like, and the server refuses to start on them."""
    links = service_link_environment(rendered["base"])
    assert "RLSERVE_SERVICE_HOST" in links and links["RLSERVE_PORT"].startswith("tcp://")
    with pytest.raises(UnknownSetting, match="RLSERVE_SERVICE_HOST"):
        check_environment(links)


def test_queue_autoscaling_reads_a_metric_the_server_exports(rendered, server):
    hpa = next(d for d in rendered["overlays/queue-hpa"] if d["kind"] == "HorizontalPodAutoscaler")
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    rules = yaml.safe_load((MANIFESTS / "overlays" / "queue-hpa" / "prometheus-adapter-rules.yaml").read_text())
    served = {rule["name"]["as"]: re.match(r"(\w+)\{", rule["seriesQuery"])[1] for rule in rules["rules"]}
    assert pods_metrics and set(pods_metrics) <= set(served), "the HPA reads a metric the adapter does not serve"
    for exported in served.values():
        assert exported in server["metrics"], f"{exported} is not on the server's /metrics"
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])


def test_gpu_overlay_asks_for_a_gpu_and_the_gpu_image(rendered):
    ((_, base),) = rlserve_pods(rendered["base"])
    ((_, gpu),) = rlserve_pods(rendered["overlays/gpu"])
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["image"] != base["image"] and gpu["image"].endswith(":gpu")
    assert environment(gpu, rendered["overlays/gpu"]).get("RLSERVE_USE_GPU", "true") == "true"


def test_external_redis_overlay_takes_the_url_from_a_secret(rendered):
    docs = rendered["overlays/external-redis"]
    assert not [d for d in docs if "valkey" in d["metadata"]["name"]]
    ((_, container),) = rlserve_pods(docs)
    (var,) = [v for v in container["env"] if v["name"] == "RLSERVE_SESSION_STORE"]
    assert var["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert "RLSERVE_SESSION_STORE" not in next(d for d in docs if d["kind"] == "ConfigMap")["data"]


def test_kserve_runtime_uses_the_servers_names(rendered, server, monkeypatch):
    runtime, service = (next(d for d in rendered["kserve"] if d["kind"] == kind)
                        for kind in ("ServingRuntime", "InferenceService"))
    (container,) = runtime["spec"]["containers"]
    predictor = service["spec"]["predictor"]
    env = environment(container, []) | environment(predictor["model"], [])
    settings = settings_of(env, monkeypatch)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http1": settings.port, "h2c": settings.grpc_port}
    assert str(settings.repository) == KSERVE_MODEL_DIR
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in server["routes"]
        assert container[probe]["httpGet"]["port"] == settings.port
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/path"] in server["routes"]
    assert annotations["prometheus.kserve.io/port"] == str(settings.port)
    assert predictor["enableServiceLinks"] is False
    assert predictor["terminationGracePeriodSeconds"] >= settings.shutdown_drain_s + IN_FLIGHT_S
    assert container["securityContext"]["runAsUser"] == image_uid()
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
    formats = {(f["name"], f["version"]) for f in runtime["spec"]["supportedModelFormats"]}
    model = predictor["model"]
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["runtime"] == runtime["metadata"]["name"]
