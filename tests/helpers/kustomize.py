"""The Kubernetes manifests as ``kubectl apply -k deploy/kubernetes`` sends them, read
without kustomize, and what the tests need to read them: each container's environment as
the kubelet makes it, its ports by name, the SpecEyes containers among them.

``render`` is the part of kustomize the base uses and nothing more: files named under
``resources``, ``namespace`` (set on every namespaced object) and ``labels`` (added to
every object's labels and, with ``includeTemplates``, to its pod templates; never to
selectors). A kustomization that asks for anything else is refused, so the base cannot
grow a field this reading would silently ignore; where ``kubectl`` is installed a test
holds ``render`` equal to ``kubectl kustomize``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"

UNDERSTOOD = {"apiVersion", "kind", "namespace", "labels", "resources"}
LABEL_FIELDS = {"pairs", "includeSelectors", "includeTemplates"}
CLUSTER_SCOPED = {
    "Namespace",
    "PersistentVolume",
    "StorageClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
}
# where a kind keeps the pod templates kustomize labels (includeTemplates)
TEMPLATES = {
    "Deployment": [("spec", "template")],
    "StatefulSet": [("spec", "template")],
    "DaemonSet": [("spec", "template")],
    "ReplicaSet": [("spec", "template")],
    "Job": [("spec", "template")],
    "CronJob": [("spec", "jobTemplate"), ("spec", "jobTemplate", "spec", "template")],
}
SPECEYES_IMAGE = re.compile(r"^(?:.*/)?speceyes(?::[^/]+)?$")
REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

Doc = dict[str, Any]


def kustomization(base: Path = BASE) -> Doc:
    loaded: Doc = yaml.safe_load((base / "kustomization.yaml").read_text())
    return loaded


def render(base: Path = BASE) -> list[Doc]:
    """The objects the kustomization at ``base`` makes, in its resources' order."""
    spec = kustomization(base)
    unknown = sorted(set(spec) - UNDERSTOOD)
    if unknown:
        raise ValueError(f"kustomization.yaml uses {unknown}, which render() does not apply")
    labels: dict[str, str] = {}
    in_templates = False
    for entry in spec.get("labels", []):
        extra = sorted(set(entry) - LABEL_FIELDS)
        if extra or entry.get("includeSelectors"):
            raise ValueError(f"labels entry {entry}: render() applies pairs and templates only")
        labels.update(entry["pairs"])
        in_templates = in_templates or bool(entry.get("includeTemplates"))
    docs: list[Doc] = []
    for name in spec["resources"]:
        path = base / name
        if not path.is_file():
            raise ValueError(f"resource {name}: render() reads files of the base only")
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    namespace = spec.get("namespace")
    for doc in docs:
        metadata = doc.setdefault("metadata", {})
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            metadata["namespace"] = namespace
        if labels:
            metadata["labels"] = {**metadata.get("labels", {}), **labels}
            templates = [_at(doc, path) for path in TEMPLATES.get(doc["kind"], [])]
            if doc["kind"] == "StatefulSet":  # (its volumes' claims are templates too)
                templates += doc["spec"].get("volumeClaimTemplates", [])
            for template in templates if in_templates else []:
                template_metadata = template.setdefault("metadata", {})
                template_metadata["labels"] = {**template_metadata.get("labels", {}), **labels}
    return docs


def _at(doc: Doc, path: tuple[str, ...]) -> Doc:
    node = doc
    for key in path:
        node = node[key]
    return node


# -- reading the rendered objects ---------------------------------------------------------
def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def pod_spec(doc: Doc) -> Doc | None:
    """The pod a workload runs (None for other kinds)."""
    paths = TEMPLATES.get(doc["kind"])
    return _at(doc, paths[-1])["spec"] if paths else None


def containers(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(workload, container) for every container of every pod template, init ones too."""
    for doc in docs:
        pod = pod_spec(doc)
        if pod is not None:
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                yield doc, container


def speceyes_containers(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    """The containers that run our image (its entry point is `speceyes`)."""
    return [(d, c) for d, c in containers(docs) if SPECEYES_IMAGE.match(c["image"])]


def data_of(docs: list[Doc], kind: str, name: str) -> dict[str, str]:
    """A ConfigMap's data, a Secret's (stringData as written; data decoded)."""
    doc = one(docs, kind, name)
    if kind == "ConfigMap":
        return {**doc.get("data", {})}
    values = {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()}
    return {**values, **doc.get("stringData", {})}


def environment(docs: list[Doc], container: Doc) -> dict[str, str]:
    """The container's variables as the kubelet sets them: ``envFrom`` first, then
    ``env`` in order, each ``$(NAME)`` replaced by a variable defined before it."""
    found: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            found.update(data_of(docs, "ConfigMap", source["configMapRef"]["name"]))
        if "secretRef" in source:
            found.update(data_of(docs, "Secret", source["secretRef"]["name"]))
    for variable in container.get("env", []):
        if "value" in variable:
            value = REFERENCE.sub(lambda m: found.get(m.group(1), m.group(0)), variable["value"])
        else:
            ref = variable["valueFrom"]
            kind, key = (
                ("ConfigMap", ref["configMapKeyRef"])
                if "configMapKeyRef" in ref
                else ("Secret", ref["secretKeyRef"])
            )
            value = data_of(docs, kind, key["name"])[key["key"]]
        found[variable["name"]] = value
    return found


def named_port(container: Doc, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return int(number)
