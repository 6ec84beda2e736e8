"""Cluster infrastructure, offline: manifests against the Kubernetes and KubeRay schemas, Ray's token auth,
Workload Identity and the MLflow server's locks (the CronJob, the image and the cron summary:
tests/test_infra_cron.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml
from drivers import ROOT

kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")

INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
README = ROOT / "docs" / "howto" / "cluster.md"
K8S_VERSION = "1.34.0"  # GKE rapid channel; Ironwood needs 1.34+
RAYCLUSTER = json.loads((INFRA / "schemas" / "raycluster.ray.io_v1.json").read_text())
GKE_ACCELERATOR = {"v5p": "tpu-v5p-slice", "tpu7x": "tpu7x"}  # node label value per conf/cluster accelerator
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def manifests() -> list[tuple[str, dict]]:
    return [
        (p.name, d)
        for p in sorted(K8S.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def one(kind: str) -> dict:
    (doc,) = [d for _, d in manifests() if d["kind"] == kind]
    return doc


def validate(doc: dict) -> None:
    """Strict Kubernetes schemas (unknown fields fail); RayCluster by the vendored CRD schema, its pods by Kubernetes."""
    if doc["kind"] != "RayCluster":
        kv.validate(doc, K8S_VERSION, strict=True)
        return
    jsonschema.validate(doc, RAYCLUSTER, cls=jsonschema.Draft202012Validator)
    spec = doc["spec"]
    for t in [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec.get("workerGroupSpecs", [])]:
        kv.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": t},
            K8S_VERSION,
            strict=True,
        )


def containers(doc: dict) -> list[dict]:
    """Every container (and init container) in any pod template of the manifest."""
    found = []

    def walk(x):
        if isinstance(x, dict):
            for key in ("containers", "initContainers"):
                if isinstance(x.get(key), list):
                    found.extend(x[key])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    return found


def documented(marker: str) -> str:
    """The code block right after `<!-- marker -->` in docs/howto/cluster.md."""
    m = re.search(rf"<!-- {marker} -->\s*```\w*\n(.*?)```", README.read_text(), re.S)
    assert m, f"no code block after <!-- {marker} --> in {README}"
    return m.group(1).strip()


def cron_container() -> dict:
    (c,) = containers(one("CronJob"))
    return c


# --- schemas ---------------------------------------------------------------------------------------------


def test_vendored_raycluster_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(RAYCLUSTER)


@pytest.mark.parametrize("name, doc", manifests(), ids=lambda x: x if isinstance(x, str) else "")
def test_manifest_validates(name, doc):
    validate(doc)


@pytest.mark.parametrize(
    "kind, path, value",
    [
        ("RayCluster", ["spec", "workerGroupSpecs", 0, "numOfHost"], 16),  # typo of numOfHosts
        ("RayCluster", ["spec", "headGroupSpec", "rayStartParams", "num-cpus"], 0),  # the CRD wants strings
        (
            "RayCluster",
            ["spec", "workerGroupSpecs", 0, "template", "spec", "nodeSelecter"],
            {},
        ),  # pod field typo
        ("CronJob", ["spec", "jobTemplate", "spec", "template", "spec", "containers", 0, "comand"], ["x"]),
        ("Deployment", ["spec", "replicas"], "one"),
        ("NetworkPolicy", ["spec", "ingress", 0, "form"], []),  # a typo of from would admit everyone
    ],
)
def test_validation_catches_mistakes(kind, path, value):
    doc = copy.deepcopy(one(kind))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_kustomization_applies_every_manifest_with_one_image():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    (img,) = k["images"]
    ours = [c for _, d in manifests() for c in containers(d) if c["name"] != "cloud-sql-proxy"]
    assert ours and all(c["image"] == img["name"] for c in ours)


# --- what the manifests say ---------------------------------------------------------------------------------


@pytest.mark.parametrize("group, conf", [("v5p-128", "v5p_128"), ("tpu7x-128", "tpu7x_128")])
def test_tpu_worker_group_matches_the_cluster_config(group, conf):
    c = yaml.safe_load((ROOT / "conf" / "cluster" / f"{conf}.yaml").read_text())
    (g,) = [g for g in one("RayCluster")["spec"]["workerGroupSpecs"] if g["groupName"] == group]
    pod = g["template"]["spec"]
    assert g["numOfHosts"] == c["hosts"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": GKE_ACCELERATOR[c["accelerator"]],
        "cloud.google.com/gke-tpu-topology": c["topology"],
    }
    res = pod["containers"][0]["resources"]
    chips_per_host = int(res["limits"]["google.com/tpu"])
    assert res["requests"]["google.com/tpu"] == res["limits"]["google.com/tpu"]
    chips = 1
    for d in c["topology"].split("x"):
        chips *= int(d)
    assert chips_per_host * g["numOfHosts"] == chips == 64


def test_every_ray_node_and_client_uses_the_same_token_secret():
    ray_pods = containers(one("RayCluster")) + [cron_container()]
    for c in ray_pods:
        env = {e["name"]: e for e in c["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", c["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "ray-auth-token",
            "key": "token",
        }


def test_google_access_is_workload_identity_without_key_files():
    sas = {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == "ServiceAccount"}
    for name in ("cp-ray", "cp-mlflow"):
        gsa = sas[name]["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
        assert gsa.startswith(f"{name}@") and gsa.endswith(".iam.gserviceaccount.com")
    text = "".join(p.read_text() for p in K8S.glob("*.yaml"))
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in text and "credentials.json" not in text


def test_mlflow_server_stores_in_sql_and_gcs_and_admits_the_head():
    from mlflow.server.security_utils import is_allowed_host_header

    (c,) = [c for c in containers(one("Deployment")) if c["name"] == "mlflow"]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"] if "=" in a)
    assert args["artifacts-destination"].startswith("gs://")
    assert args["backend-store-uri"] == "$(MLFLOW_BACKEND_STORE_URI)"
    env = {e["name"]: e for e in c["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-db"
    head = one("RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    uri = {e["name"]: e.get("value") for e in head["env"]}["MLFLOW_TRACKING_URI"]
    # MLflow 3 rejects a Host header it does not know: the head's requests must pass.
    assert is_allowed_host_header(args["allowed-hosts"].split(","), urlparse(uri).netloc)
    assert urlparse(uri).hostname.split(".")[0] == one("Service")["metadata"]["name"]


def pod_templates() -> dict[str, dict]:
    """Every pod template in the manifests by a readable name: its labels are what a NetworkPolicy sees."""
    ray = one("RayCluster")["spec"]
    out = {"ray head": ray["headGroupSpec"]["template"]}
    out |= {f"ray worker {g['groupName']}": g["template"] for g in ray["workerGroupSpecs"]}
    out["cronjob"] = one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    out["mlflow"] = one("Deployment")["spec"]["template"]
    return out


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    return selector["matchLabels"].items() <= labels.items()


def mlflow_container() -> dict:
    (c,) = [c for c in containers(one("Deployment")) if c["name"] == "mlflow"]
    return c


def test_only_the_ray_head_and_the_cronjob_reach_mlflow():
    policy, templates = one("NetworkPolicy")["spec"], pod_templates()
    labels = {name: t["metadata"]["labels"] for name, t in templates.items()}
    assert [n for n in labels if selects(policy["podSelector"], labels[n])] == ["mlflow"]
    assert policy["podSelector"]["matchLabels"].items() <= one("Service")["spec"]["selector"].items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # no namespace or IP block let in
    admitted = {n for n in labels for peer in rule["from"] if selects(peer["podSelector"], labels[n])}
    assert admitted == {"ray head", "cronjob"}  # TPU workers never talk to MLflow: the driver logs for them
    assert [p["port"] for p in rule["ports"]] == [p["containerPort"] for p in mlflow_container()["ports"]]


def test_mlflow_runs_basic_auth_with_credentials_from_a_secret():
    from mlflow import environment_variables as ev
    from mlflow.server import _find_app

    c = mlflow_container()
    assert "--app-name=basic-auth" in c["args"] and _find_app("basic-auth")  # an app this mlflow ships
    env = {e["name"]: e for e in c["env"]}
    secret = {"name": "mlflow-auth"}
    for var, key in (
        (ev.MLFLOW_AUTH_ADMIN_USERNAME, "username"),
        (ev.MLFLOW_AUTH_ADMIN_PASSWORD, "password"),
        (ev.MLFLOW_FLASK_SERVER_SECRET_KEY, "flask-secret-key"),  # the auth app refuses to start without it
    ):
        assert env[var.name]["valueFrom"]["secretKeyRef"] == secret | {"key": key}
    # the auth config (its database_uri holds a password) is a file mounted from the same secret
    path = Path(env[ev.MLFLOW_AUTH_CONFIG_PATH.name]["value"])
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (vol,) = [
        v for v in one("Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    assert vol["secret"]["secretName"] == "mlflow-auth" and mount["readOnly"]
    assert {"key": "basic_auth.ini", "path": path.name} in vol["secret"]["items"]
    # the pods the NetworkPolicy admits log in as that user, from the same secret; no other pod holds it
    login = [secret | {"key": "username"}, secret | {"key": "password"}]
    for name, t in pod_templates().items():
        for k in t["spec"]["containers"]:
            refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in k.get("env", [])}
            got = [refs.get(ev.MLFLOW_TRACKING_USERNAME.name), refs.get(ev.MLFLOW_TRACKING_PASSWORD.name)]
            assert got == (login if name in ("ray head", "cronjob") else [None, None]), (name, k["name"])
    assert not [d for _, d in manifests() if d["kind"] == "Secret"]  # created by hand, never committed
