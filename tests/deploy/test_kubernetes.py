"""deploy/kubernetes, checked offline: every object valid for its schema, and wired to
what the code really reads and serves.

- Rendered as ``kubectl apply -k`` would (``tests.helpers.kustomize.render``; equal to
  ``kubectl kustomize`` where kubectl is installed).
- Every built-in kind valid for Kubernetes ``KUBERNETES`` (kubernetes-validate's
  schemas, strict: a misspelt field fails); the KEDA ScaledObjects valid for the schema
  beside this file (written from KEDA v2.20's CRD).
- The wiring, each check a function that raises ``AssertionError`` (``WIRING``): every
  SpecEyes container's settings are real settings that validate, with a database URL on
  PgBouncer's Service and a broker URL on Redis's; its command parses with the real
  command line; its probes name a port it serves on and a path the code answers; each
  ScaledObject scales an existing worker Deployment on exactly the Redis lists its
  queues use, as kombu names them under the configured key prefix.
- ``test_each_check_catches_what_it_guards`` breaks the rendered objects one way at a
  time and expects the matching check to fail, so no check passes by reading nothing.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from configparser import ConfigParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kombu.transport.redis import PRIORITY_STEPS

from api.routes.health import router
from cli.main import build_parser
from common.config import Settings, default_of, leaves
from tests.helpers.kustomize import (
    BASE,
    Doc,
    data_of,
    environment,
    find,
    kustomization,
    named_port,
    one,
    pod_spec,
    render,
    speceyes_containers,
)
from workers.queues import AUDIT_PRIORITY, BROKER_PRIORITY, priority_keys
from workers.supervision import serve_health

pytestmark = pytest.mark.unit

# the oldest Kubernetes we say the base runs on, and the newest kubernetes-validate knows
KUBERNETES = ("1.32", kubernetes_validate.latest_version())
KEDA_SCHEMA = Path(__file__).with_name("keda_scaledobject.schema.yaml")
WORKER_PROBE_PATHS = {"/healthz", "/readyz"}  # (beside /metrics, on --metrics-port)
MODEL_LOAD_S = 600  # the least a worker's startup probe must allow


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render()


# -- rendering and schemas -------------------------------------------------------------
def test_the_kustomization_names_every_manifest_and_only_fields_render_applies():
    listed = set(kustomization()["resources"])
    on_disk = {path.name for path in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, f"not listed: {on_disk - listed}; missing: {listed - on_disk}"
    render()  # (refuses a field it does not apply)


def test_render_refuses_what_it_does_not_apply(tmp_path: Path):
    for extra in ("configMapGenerator: []", "patches: []", "commonLabels: {a: b}"):
        (tmp_path / "kustomization.yaml").write_text(f"resources: []\n{extra}\n")
        with pytest.raises(ValueError, match="does not apply"):
            render(tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (its kustomize)")
def test_render_is_what_kubectl_kustomize_makes(docs: list[Doc]):
    made = subprocess.run(
        ["kubectl", "kustomize", str(BASE)], capture_output=True, text=True, check=True
    ).stdout
    theirs = [doc for doc in yaml.safe_load_all(made) if doc]

    def by_name(objects: list[Doc]) -> dict[tuple[str, str], Doc]:
        return {(d["kind"], d["metadata"]["name"]): d for d in objects}

    assert by_name(docs) == by_name(theirs)


def valid_for_kubernetes(docs: list[Doc]) -> None:
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        for version in KUBERNETES:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(map(str, exc.path))
                message = f"{_name(doc)} at {where} ({version}): {exc.message}"
                raise AssertionError(message) from None


def valid_for_keda(docs: list[Doc]) -> None:
    validator = jsonschema.Draft202012Validator(yaml.safe_load(KEDA_SCHEMA.read_text()))
    scaled = find(docs, "ScaledObject")
    assert scaled, "no ScaledObject"
    for doc in scaled:
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, f"{_name(doc)}: {errors}"
        spec = doc["spec"]
        least, most = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        assert least <= most, f"{_name(doc)}: minReplicaCount {least} > maxReplicaCount {most}"
        formula = spec.get("advanced", {}).get("scalingModifiers", {}).get("formula")
        if formula:  # (KEDA's webhook: every trigger named, the formula's names among them)
            names = [t.get("name") for t in spec["triggers"]]
            assert all(names), f"{_name(doc)}: a trigger without a name"
            assert set(re.findall(r"[A-Za-z_]\w*", formula)) <= set(names), formula


def test_every_builtin_object_is_valid_for_kubernetes(docs: list[Doc]):
    valid_for_kubernetes(docs)


def test_every_scaled_object_is_valid_for_keda(docs: list[Doc]):
    valid_for_keda(docs)


# -- the wiring -------------------------------------------------------------------------
def _name(doc: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def settings_of(docs: list[Doc], container: Doc, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the container's process reads: its SPECEYES_* variables, nothing else
    of this machine's (an AssertionError when one does not validate)."""
    with monkeypatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("SPECEYES_")]:
            patch.delenv(name)
        patch.chdir(BASE)  # (no .env file there)
        for name, value in environment(docs, container).items():
            patch.setenv(name, value)
        try:
            return Settings()
        except Exception as exc:
            message = f"{container['name']}: its settings do not validate: {exc}"
            raise AssertionError(message) from None


def wired_settings(docs: list[Doc]) -> None:
    """Every SPECEYES_ variable a manifest sets is a setting; every SpecEyes container
    has a database and a broker."""
    known = {leaf.env for leaf in leaves()}
    for kind in ("ConfigMap", "Secret"):
        for doc in find(docs, kind):
            for name in data_of(docs, kind, doc["metadata"]["name"]):
                assert not name.startswith("SPECEYES_") or name in known, f"{name}: no setting"
    assert speceyes_containers(docs), "no SpecEyes container"
    for workload, container in speceyes_containers(docs):
        env = environment(docs, container)
        for name in env:
            assert not name.startswith("SPECEYES_") or name in known, f"{name}: no setting"
        for needed in ("SPECEYES_DATABASE_URL", "SPECEYES_BROKER_URL"):
            assert needed in env, f"{_name(workload)}: no {needed}"
        assert not re.search(r"\$\(\w+\)", env["SPECEYES_DATABASE_URL"]), "unresolved $(...)"


def wired_settings_validate(docs: list[Doc]) -> None:
    patch = pytest.MonkeyPatch()
    try:
        for _, container in speceyes_containers(docs):
            settings_of(docs, container, patch)
    finally:
        patch.undo()


def _service_port(docs: list[Doc], host: str, port: int) -> Doc:
    """The Service a URL's host names, which must serve its port."""
    services = find(docs, "Service", host.split(".")[0])
    assert services, f"{host}: no such Service"
    (service,) = services
    assert port in [p["port"] for p in service["spec"]["ports"]], f"{host}: no port {port}"
    return service


def _selected(docs: list[Doc], service: Doc) -> list[Doc]:
    selector = service["spec"]["selector"]
    return [
        doc
        for doc in docs
        if pod_spec(doc) is not None and selector.items() <= _template_labels(doc).items()
    ]


def _template_labels(doc: Doc) -> dict[str, str]:
    spec = doc["spec"]
    template = (
        spec["jobTemplate"]["spec"]["template"] if "jobTemplate" in spec else spec["template"]
    )
    return dict(template["metadata"].get("labels", {}))


def wired_database(docs: list[Doc]) -> None:
    """Every database URL reaches PostgreSQL through PgBouncer's Service, as a user and
    with the password PgBouncer knows, for a database it pools, in transaction mode."""
    ini = ConfigParser()
    ini.read_string(data_of(docs, "ConfigMap", "pgbouncer-config")["pgbouncer.ini"])
    bouncer = ini["pgbouncer"]
    users = dict(
        re.findall(
            r'^"([^"]+)" "([^"]*)"$',
            data_of(docs, "Secret", "speceyes-secrets")["userlist.txt"],
            re.M,
        )
    )
    (postgres,) = find(docs, "StatefulSet", "postgres")
    postgres_env = environment(docs, postgres["spec"]["template"]["spec"]["containers"][0])
    for workload, container in speceyes_containers(docs):
        url = urlsplit(environment(docs, container)["SPECEYES_DATABASE_URL"])
        service = _service_port(docs, url.hostname or "", url.port or 5432)
        targets = _selected(docs, service)
        found = [d["metadata"]["name"] for d in targets]
        assert found == ["pgbouncer"], f"{_name(workload)}: {url.hostname} is {found}"
        assert url.port == int(bouncer["listen_port"]), "not PgBouncer's port"
        assert url.path.lstrip("/") in ini["databases"], f"PgBouncer pools no {url.path}"
        assert users.get(url.username or "") == url.password, "a user PgBouncer refuses"
        assert url.password == postgres_env["POSTGRES_PASSWORD"], "not PostgreSQL's password"
        assert url.username == postgres_env["POSTGRES_USER"], _name(workload)
    # why transaction pooling is right here: pgbouncer.yaml's comment
    assert bouncer["pool_mode"] == "transaction"
    assert bouncer["server_reset_query_always"] == "1" and bouncer["server_reset_query"]
    assert int(bouncer["max_prepared_statements"]) > 0, "psycopg's prepared statements"
    replicas = one(docs, "Deployment", "pgbouncer")["spec"]["replicas"]
    per_replica = int(bouncer["default_pool_size"]) + int(bouncer.get("reserve_pool_size", 0))
    args = postgres["spec"]["template"]["spec"]["containers"][0].get("args", [])
    limit = int(next(a.split("=")[1] for a in args if a.startswith("max_connections=")))
    assert replicas * per_replica < limit, "PgBouncer's pools exceed max_connections"


def wired_broker(docs: list[Doc]) -> None:
    """Every broker URL is Redis's Service; KEDA reads the same Redis, by the name its
    Service has in the kustomization's namespace."""
    namespace = kustomization()["namespace"]
    for _, container in speceyes_containers(docs):
        url = urlsplit(environment(docs, container)["SPECEYES_BROKER_URL"])
        service = _service_port(docs, url.hostname or "", url.port or 6379)
        assert [d["metadata"]["name"] for d in _selected(docs, service)] == ["redis"]
        for scaled in find(docs, "ScaledObject"):
            for trigger in scaled["spec"]["triggers"]:
                meta = trigger["metadata"]
                host, _, port = meta["address"].rpartition(":")
                assert host == f"{url.hostname}.{namespace}.svc.cluster.local", meta["address"]
                assert int(port) == (url.port or 6379), meta["address"]
                assert meta.get("databaseIndex", "0") == (url.path.lstrip("/") or "0")


def depth_lists(settings: Settings, pool: str) -> set[str]:
    """The Redis lists that hold the messages waiting for a ``pool`` worker: its queues
    (a slow worker takes audits too) at the priority steps the code sends on, named as
    kombu names them under the key prefix."""
    broker = settings.broker
    queues = (
        {broker.fast_queue: set(BROKER_PRIORITY.values())}
        if pool == "fast"
        else {
            broker.slow_queue: set(BROKER_PRIORITY.values()),
            broker.audit_queue: {AUDIT_PRIORITY},
        }
    )
    lists = set()
    for queue, steps in queues.items():
        keys = dict(zip(PRIORITY_STEPS, priority_keys(broker.key_prefix + queue), strict=True))
        lists |= {keys[step] for step in steps}
    return lists


def wired_scaling(docs: list[Doc]) -> None:
    """Each ScaledObject scales a worker Deployment on exactly the lists its queues use,
    from zero, each list counted once in its formula."""
    patch = pytest.MonkeyPatch()
    try:
        scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in find(docs, "ScaledObject")}
        workers = {
            d["metadata"]["name"]: c
            for d, c in speceyes_containers(docs)
            if d["kind"] == "Deployment" and c["args"][:1] == ["worker"]
        }
        assert workers, "no worker Deployment"
        assert set(scaled) == set(workers), f"scaled {sorted(scaled)}, workers {sorted(workers)}"
        for name, container in workers.items():
            spec = scaled[name]["spec"]
            assert spec.get("scaleTargetRef", {}).get("kind", "Deployment") == "Deployment"
            assert "replicas" not in one(docs, "Deployment", name)["spec"], "KEDA's to set"
            assert spec["minReplicaCount"] == 0, f"{name} does not go to zero"
            pool = container["args"][1]
            expected = depth_lists(settings_of(docs, container, patch), pool)
            lists = [t["metadata"]["listName"] for t in spec["triggers"] if t["type"] == "redis"]
            assert sorted(lists) == sorted(expected), f"{name}: {lists} != {sorted(expected)}"
            formula = spec["advanced"]["scalingModifiers"]["formula"]
            terms = sorted(re.findall(r"[A-Za-z_]\w*", formula))
            assert terms == sorted(t["name"] for t in spec["triggers"]), formula
            assert set(formula.replace(" ", "")) - set("".join(terms)) <= {"+"}, formula
    finally:
        patch.undo()


def wired_commands(docs: list[Doc]) -> None:
    """Every SpecEyes container runs one image and a command the command line takes; the
    migration Job runs `db upgrade`; no pod gets variables from Services."""
    images = {container["image"] for _, container in speceyes_containers(docs)}
    assert len(images) == 1, f"several images: {images}"
    for workload, container in speceyes_containers(docs):
        args = container.get("args", [])
        assert "command" not in container, "the image's entry point is `speceyes`"
        try:
            build_parser(args).parse_args(args)
        except SystemExit:
            message = f"{_name(workload)}: `speceyes {' '.join(args)}` is refused"
            raise AssertionError(message) from None
        assert pod_spec(workload)["enableServiceLinks"] is False, _name(workload)
    (job,) = find(docs, "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def wired_probes(docs: list[Doc]) -> None:
    """A worker's probes are its health endpoints on --metrics-port (after a startup
    generous enough for a model load); the API's on the port it serves."""
    api_paths = {getattr(route, "path", None) for route in router.routes}
    for workload, container in speceyes_containers(docs):
        args = container["args"]
        probes = {k: container.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe")}
        if args[0] == "worker":
            port, paths = _flag(args, "--metrics-port"), WORKER_PROBE_PATHS
            assert port is not None, f"{_name(workload)} serves no health endpoints"
            assert all(probes.values()), f"{_name(workload)}: a probe missing"
            startup = probes["startupProbe"]
            allowed = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
            assert allowed >= MODEL_LOAD_S, f"{_name(workload)}: {allowed} s to load models"
        elif args[0] == "serve":
            port = _flag(args, "--port") or str(default_of("api.port"))
            paths = api_paths & {"/healthz", "/readyz"}
            assert probes["livenessProbe"] and probes["readinessProbe"], _name(workload)
        else:
            continue
        for kind, probe in probes.items():
            if probe is None:
                continue
            get = probe["httpGet"]
            assert named_port(container, get["port"]) == int(port), f"{_name(workload)} {kind}"
            assert get["path"] in paths, f"{_name(workload)} {kind}: {get['path']}"


WIRING: dict[str, Callable[[list[Doc]], None]] = {
    "settings": wired_settings,
    "settings_validate": wired_settings_validate,
    "database": wired_database,
    "broker": wired_broker,
    "scaling": wired_scaling,
    "commands": wired_commands,
    "probes": wired_probes,
}


@pytest.mark.parametrize("check", WIRING, ids=str)
def test_the_manifests_are_wired_to_the_code(docs: list[Doc], check: str):
    WIRING[check](copy.deepcopy(docs))


def test_the_worker_probe_paths_are_what_its_health_server_answers():
    """The paths the worker probes name reach the supervisor's health answer on a real
    ``serve_health`` (everything else is the metrics app's)."""
    asked: list[str] = []

    class Supervisor:
        def health(self, path: str) -> tuple[int, dict[str, Any]]:
            asked.append(path)
            return 200, {"path": path}

    def metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"# metrics\n"]

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    serve_health(port, Supervisor(), metrics)  # type: ignore[arg-type] (a stand-in)
    for path in sorted(WORKER_PROBE_PATHS):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            assert json.loads(answer.read()) == {"path": path}
    assert asked == sorted(WORKER_PROBE_PATHS)


# -- each check can fail -----------------------------------------------------------------
def _container(docs: list[Doc], name: str) -> Doc:
    pod = pod_spec(one(docs, "Deployment", name))
    assert pod is not None
    container: Doc = pod["containers"][0]
    return container


def _spec(docs: list[Doc], kind: str, name: str) -> Doc:
    spec: Doc = one(docs, kind, name)["spec"]
    return spec


def _config(docs: list[Doc]) -> dict[str, str]:
    data: dict[str, str] = one(docs, "ConfigMap", "speceyes-config")["data"]
    return data


def _set_env(docs: list[Doc], deployment: str, name: str, value: str | None) -> None:
    """Set (or, with None, remove) one of a Deployment's variables."""
    env = _container(docs, deployment)["env"]
    env[:] = [v for v in env if v["name"] != name]
    if value is not None:
        env.append({"name": name, "value": value})


def _database(docs: list[Doc], deployment: str, url: str) -> None:
    _set_env(docs, deployment, "SPECEYES_DATABASE_URL", url)


def _trigger(docs: list[Doc], scaled: str, index: int = 0) -> Doc:
    trigger: Doc = _spec(docs, "ScaledObject", scaled)["triggers"][index]
    return trigger


def _bouncer(docs: list[Doc], old: str, new: str) -> None:
    data = one(docs, "ConfigMap", "pgbouncer-config")["data"]
    data["pgbouncer.ini"] = data["pgbouncer.ini"].replace(old, new)


def _probe(docs: list[Doc], deployment: str, probe: str) -> Doc:
    found: Doc = _container(docs, deployment)[probe]
    return found


def _formula(docs: list[Doc], scaled: str, formula: str) -> None:
    _spec(docs, "ScaledObject", scaled)["advanced"]["scalingModifiers"]["formula"] = formula


AUDIT_LIST = "speceyes:speceyes.audit\x06\x169"
PASSWORD = "CHANGE-ME"  # (secrets.yaml's placeholder)
BREAKS: list[tuple[str, str, Callable[[list[Doc]], None]]] = [
    # (the check that must fail, what is broken, how)
    ("kubernetes", "a misspelt field", lambda d: _container(d, "api").update(imagePullPolcy="x")),
    (
        "kubernetes",
        "a port as text",
        lambda d: _container(d, "api")["ports"][0].update(containerPort="80"),
    ),
    (
        "keda",
        "a misspelt field",
        lambda d: _spec(d, "ScaledObject", "worker-fast").update(minReplicas=0),
    ),
    (
        "keda",
        "a key the redis scaler ignores",
        lambda d: _trigger(d, "worker-slow")["metadata"].update(queue="x"),
    ),
    (
        "keda",
        "min above max",
        lambda d: _spec(d, "ScaledObject", "worker-slow").update(minReplicaCount=2000),
    ),
    (
        "keda",
        "a formula naming an unnamed trigger",
        lambda d: _trigger(d, "worker-fast").pop("name"),
    ),
    (
        "settings",
        "a variable no setting reads",
        lambda d: _config(d).update(SPECEYES_BROKER_PREFIX="x:"),
    ),
    ("settings", "a worker without a database", lambda d: _database(d, "worker-slow", None)),
    ("settings", "no broker", lambda d: _config(d).pop("SPECEYES_BROKER_URL")),
    (
        "settings_validate",
        "a value its setting refuses",
        lambda d: _config(d).update(SPECEYES_VISIBILITY_TIMEOUT_S="-1"),
    ),
    (
        "database",
        "straight to PostgreSQL",
        lambda d: _database(
            d, "worker-fast", f"postgresql+psycopg://speceyes:{PASSWORD}@postgres:5432/speceyes"
        ),
    ),
    (
        "database",
        "a password PgBouncer does not know",
        lambda d: _database(
            d, "api", "postgresql+psycopg://speceyes:other@pgbouncer:6432/speceyes"
        ),
    ),
    (
        "database",
        "a database PgBouncer does not pool",
        lambda d: _database(
            d, "api", f"postgresql+psycopg://speceyes:{PASSWORD}@pgbouncer:6432/other"
        ),
    ),
    (
        "database",
        "session pooling",
        lambda d: _bouncer(d, "pool_mode = transaction", "pool_mode = session"),
    ),
    (
        "database",
        "server pools over max_connections",
        lambda d: _bouncer(d, "default_pool_size = 40", "default_pool_size = 100"),
    ),
    (
        "broker",
        "a Redis that is not there",
        lambda d: _config(d).update(SPECEYES_BROKER_URL="redis://cache:6379/0"),
    ),
    (
        "broker",
        "KEDA on another namespace's Redis",
        lambda d: _trigger(d, "worker-fast")["metadata"].update(
            address="redis.default.svc.cluster.local:6379"
        ),
    ),
    (
        "broker",
        "KEDA on another database",
        lambda d: _trigger(d, "worker-slow")["metadata"].update(databaseIndex="1"),
    ),
    (
        "scaling",
        "another key prefix",
        lambda d: _config(d).update(SPECEYES_BROKER_KEY_PREFIX="other:"),
    ),
    ("scaling", "another queue name", lambda d: _config(d).update(SPECEYES_SLOW_QUEUE="agents")),
    (
        "scaling",
        "a priority's list missing",
        lambda d: _spec(d, "ScaledObject", "worker-slow")["triggers"].pop(2),
    ),
    (
        "scaling",
        "the audit list counted for the fast pool",
        lambda d: _trigger(d, "worker-fast", 2)["metadata"].update(listName=AUDIT_LIST),
    ),
    (
        "scaling",
        "a Deployment that does not exist",
        lambda d: _spec(d, "ScaledObject", "worker-slow")["scaleTargetRef"].update(name="agents"),
    ),
    (
        "scaling",
        "never to zero",
        lambda d: _spec(d, "ScaledObject", "worker-fast").update(minReplicaCount=1),
    ),
    (
        "scaling",
        "a list counted twice",
        lambda d: _formula(d, "worker-fast", "fast_high + fast_normal + fast_low + fast_low"),
    ),
    (
        "scaling",
        "the deepest list, not the sum",
        lambda d: _formula(d, "worker-fast", "max(fast_high, fast_normal, fast_low)"),
    ),
    (
        "commands",
        "a command that does not exist",
        lambda d: _container(d, "worker-fast").update(args=["worker", "fastest"]),
    ),
    (
        "commands",
        "a flag that does not exist",
        lambda d: _container(d, "api").update(args=["serve", "--listen", "x"]),
    ),
    (
        "commands",
        "Service variables on",
        lambda d: _spec(d, "Deployment", "api")["template"]["spec"].update(enableServiceLinks=True),
    ),
    (
        "probes",
        "a worker probed on another port",
        lambda d: _probe(d, "worker-slow", "livenessProbe")["httpGet"].update(port=9102),
    ),
    (
        "probes",
        "a path nothing answers",
        lambda d: _probe(d, "worker-fast", "readinessProbe")["httpGet"].update(path="/ready"),
    ),
    (
        "probes",
        "the API probed on the metrics port",
        lambda d: _probe(d, "api", "livenessProbe")["httpGet"].update(port=9101),
    ),
    (
        "probes",
        "no time to load the models",
        lambda d: _probe(d, "worker-slow", "startupProbe").update(failureThreshold=6),
    ),
    (
        "probes",
        "no health server",
        lambda d: _container(d, "worker-fast").update(args=["worker", "fast"]),
    ),
]
CHECKS: dict[str, Callable[[list[Doc]], None]] = {
    "kubernetes": valid_for_kubernetes,
    "keda": valid_for_keda,
    **WIRING,
}


@pytest.mark.parametrize(("check", "broken", "breaking"), BREAKS, ids=[b[1] for b in BREAKS])
def test_each_check_catches_what_it_guards(
    docs: list[Doc], check: str, broken: str, breaking: Callable[[list[Doc]], None]
):
    mended = copy.deepcopy(docs)
    CHECKS[check](mended)  # (passes as it is)
    breaking(mended)
    with pytest.raises(AssertionError):
        CHECKS[check](mended)


def test_every_check_is_tried_broken():
    assert {check for check, _, _ in BREAKS} == set(CHECKS)
