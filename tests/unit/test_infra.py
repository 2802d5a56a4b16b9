"""The deployment files under infra/ and docs/spot-fleet.md say what they promise.

Nothing here can be deployed on the development machine (no Docker engine,
no Kubernetes, no cloud), so these tests parse every YAML/JSON file under
infra/ and check the settings that infra/README.md and docs/spot-fleet.md
rely on: node placement (scheduler and driver on-demand, GPU workers on spot),
worker arguments, grace periods, where credentials come from, the cloud
configs' spot/preemptible switches, the Dockerfile and the Prefect work pool
template. The option names they use were checked once against the upstream
packages (see infra/README.md); the known-key lists below pin that check.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vcdl.config import parse_config

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
DOCKERIGNORE = INFRA / "docker" / "Dockerfile.dockerignore"
DASKCLUSTER = INFRA / "kubernetes" / "daskcluster.yaml"
WORK_POOL = INFRA / "kubernetes" / "prefect-work-pool.json"
EC2 = INFRA / "cloud" / "ec2-spot.yaml"
GCP = INFRA / "cloud" / "gcp-preemptible.yaml"
SPOT_DOC = REPO / "docs" / "spot-fleet.md"

ON_DEMAND = {"node-lifecycle": "on-demand"}
SPOT = {"node-lifecycle": "spot"}
IMAGE_UID = 10001

# Keys dask-cloudprovider 2025.9.0 reads from cloudprovider.ec2 / .gcp (its
# default cloudprovider.yaml, plus GCP's extra_bootstrap and preemptible, which
# GCPCluster also reads from config). A key outside these is silently ignored,
# e.g. `spot` under cloudprovider.ec2 (EC2Cluster takes it only as an argument).
EC2_CONFIG_KEYS = {
    "region", "availability_zone", "bootstrap", "auto_shutdown", "ami", "instance_type",
    "scheduler_instance_type", "worker_instance_type", "docker_image", "vpc", "subnet_id",
    "security_groups", "filesystem_size", "key_name", "iam_instance_profile", "instance_tags",
    "volume_tags", "enable_detailed_monitoring", "use_private_ip",
}  # fmt: skip
GCP_CONFIG_KEYS = {
    "source_image", "zone", "network", "network_projectid", "projectid", "on_host_maintenance",
    "machine_type", "scheduler_machine_type", "worker_machine_type", "filesystem_size", "ngpus",
    "gpu_type", "scheduler_ngpus", "scheduler_gpu_type", "worker_ngpus", "worker_gpu_type",
    "disk_type", "docker_image", "auto_shutdown", "public_ingress", "instance_labels",
    "service_account", "extra_bootstrap", "preemptible", "bootstrap",
}  # fmt: skip
# Python-only keyword arguments of EC2Cluster / GCPCluster (and VMCluster).
CLUSTER_KWARGS = {
    "spot", "n_workers", "bootstrap", "worker_options", "env_vars", "security",
    "extra_bootstrap", "docker_args", "worker_class", "scheduler_options",
}  # fmt: skip

SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|AUTH|PGPASS", re.IGNORECASE)
AWS_KEY_ID = re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
AWS_SECRET = re.compile(r"(?i)aws_secret_access_key\s*[:=]\s*['\"]?[A-Za-z0-9/+]{40}")
URL_PASSWORD = re.compile(r"://[^/\s:@'\"]+:[^/\s@'\"]+@")
PLACEHOLDER = re.compile(r"\{\{\s*([\w.\-$]+)\s*\}\}")


def _yaml() -> Any:
    return pytest.importorskip("yaml", reason="PyYAML is not installed: YAML files not parsed")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in _yaml().safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _one(path: Path) -> dict[str, Any]:
    (doc,) = _docs(path)
    return doc


def _kind(path: Path, kind: str) -> dict[str, Any]:
    matches = [d for d in _docs(path) if d.get("kind") == kind]
    assert len(matches) == 1, f"{path.name}: expected one {kind}, found {len(matches)}"
    return matches[0]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _walk_env_lists(node: Any) -> Iterator[list[dict[str, Any]]]:
    """Every Kubernetes `env:` list (list of {name, value|valueFrom}) in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list):
                yield value
            else:
                yield from _walk_env_lists(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_env_lists(item)


def _infra_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.is_file() and p.suffix in suffixes)


# --- every file parses --------------------------------------------------------


@pytest.mark.parametrize(
    "path", _infra_files(".yaml", ".yml"), ids=lambda p: str(p.relative_to(REPO))
)
def test_yaml_files_parse(path: Path) -> None:
    docs = _docs(path)
    assert docs and all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("path", _infra_files(".json"), ids=lambda p: str(p.relative_to(REPO)))
def test_json_files_parse(path: Path) -> None:
    assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict)


def test_the_documented_files_exist() -> None:
    for path in (DOCKERFILE, DOCKERIGNORE, DASKCLUSTER, WORK_POOL, EC2, GCP, SPOT_DOC):
        assert path.is_file(), path
    for name in ("README.md", "cloud/README.md", "prefect/process-pool.md"):
        assert (INFRA / name).is_file(), name
    assert "What was run here and what was not" in (INFRA / "README.md").read_text()


# --- Dask Kubernetes operator -------------------------------------------------


def test_daskcluster_kind_and_scheduler_on_demand() -> None:
    cluster = _kind(DASKCLUSTER, "DaskCluster")
    assert cluster["apiVersion"] == "kubernetes.dask.org/v1"
    scheduler = cluster["spec"]["scheduler"]
    assert scheduler["spec"]["nodeSelector"] == ON_DEMAND
    assert not scheduler["spec"].get("tolerations"), "nothing may let the scheduler onto spot"
    # 8786/8787 stay inside the cluster.
    assert scheduler["service"]["type"] == "ClusterIP"
    ports = {p["name"]: p["port"] for p in scheduler["service"]["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    (container,) = scheduler["spec"]["containers"]
    assert container["args"][:2] == ["dask", "scheduler"]


def test_daskcluster_workers_on_spot_gpus() -> None:
    worker = _kind(DASKCLUSTER, "DaskCluster")["spec"]["worker"]
    pod = worker["spec"]
    assert worker["replicas"] >= 1
    assert pod["nodeSelector"] == SPOT
    tolerated = {(t["key"], t.get("value"), t["effect"]) for t in pod["tolerations"]}
    assert ("node-lifecycle", "spot", "NoSchedule") in tolerated
    assert ("nvidia.com/gpu", None, "NoSchedule") in tolerated
    # The cloud's preemption notice: GCP 30 s, AWS 120 s.
    assert pod["terminationGracePeriodSeconds"] in (30, 120)

    (container,) = pod["containers"]
    # The operator's CRD types resource quantities as strings.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    args = container["args"]
    assert args[:2] == ["dask", "worker"]
    assert args[args.index("--resources") + 1] == "GPU=1"
    assert args[args.index("--nthreads") + 1] == "1"
    assert args[args.index("--name") + 1] == "$(DASK_WORKER_NAME)"

    env = _env(container)
    assert env["PREFECT_API_URL"]["value"].startswith("http")
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "vcdl-ledger"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "vcdl-aws"


def test_daskcluster_pods_run_the_image_as_its_non_root_user() -> None:
    spec = _kind(DASKCLUSTER, "DaskCluster")["spec"]
    images = set()
    for role in ("scheduler", "worker"):
        pod = spec[role]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == IMAGE_UID
        images |= {c["image"] for c in pod["containers"]}
    assert len(images) == 1, "scheduler and workers must run the same image (same Dask)"


def test_autoscaler_and_network_policy_target_the_cluster() -> None:
    name = _kind(DASKCLUSTER, "DaskCluster")["metadata"]["name"]
    autoscaler = _kind(DASKCLUSTER, "DaskAutoscaler")
    assert autoscaler["apiVersion"] == "kubernetes.dask.org/v1"
    assert autoscaler["spec"]["cluster"] == name
    assert 1 <= autoscaler["spec"]["minimum"] <= autoscaler["spec"]["maximum"]

    policy = _kind(DASKCLUSTER, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "dask.org/cluster-name": name,
        "dask.org/component": "scheduler",
    }
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {8786, 8787}


# --- Prefect Kubernetes work pool ---------------------------------------------


def test_work_pool_template_declares_every_placeholder() -> None:
    template = json.loads(WORK_POOL.read_text(encoding="utf-8"))
    assert set(template) == {"job_configuration", "variables"}
    config, variables = template["job_configuration"], template["variables"]
    for key in ("command", "env", "labels", "name", "namespace", "job_manifest"):
        assert key in config
    # The Prefect server's own rule: every {{ placeholder }} is a declared variable.
    used = set(PLACEHOLDER.findall(json.dumps(config)))
    assert used <= set(variables["properties"]), used - set(variables["properties"])
    assert variables["type"] == "object"


def test_work_pool_driver_pods_on_demand_with_secret_env() -> None:
    config = json.loads(WORK_POOL.read_text(encoding="utf-8"))["job_configuration"]
    manifest = config["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == ON_DEMAND
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsUser"] == IMAGE_UID
    (container,) = pod["containers"]
    assert container["name"] == "prefect-job"  # prefect-kubernetes requires this name
    assert container["image"] == "{{ image }}"
    env = _env(container)
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "vcdl-ledger"


# --- no literal secrets anywhere ----------------------------------------------


def test_secret_env_vars_only_through_secret_key_refs() -> None:
    documents: list[Any] = [json.loads(WORK_POOL.read_text(encoding="utf-8"))]
    for path in _infra_files(".yaml", ".yml"):
        documents.extend(_docs(path))
    checked = 0
    for env in (e for doc in documents for e in _walk_env_lists(doc)):
        for item in env:
            if SECRET_NAME.search(item["name"]):
                checked += 1
                assert "value" not in item, f"{item['name']} has a literal value"
                assert "secretKeyRef" in item["valueFrom"], item["name"]
    assert checked >= 4


def test_no_secret_looking_strings_in_infra_or_docs() -> None:
    paths = [p for p in INFRA.rglob("*") if p.is_file()] + [SPOT_DOC]
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for pattern in (AWS_KEY_ID, AWS_SECRET, URL_PASSWORD):
            match = pattern.search(text)
            assert match is None, f"{path.relative_to(REPO)}: {match.group(0) if match else ''}"


# --- dask-cloudprovider configs -----------------------------------------------


def test_ec2_config_spot_workers_and_known_keys() -> None:
    doc = _one(EC2)
    ec2 = doc["cloudprovider"]["ec2"]
    assert set(ec2) <= EC2_CONFIG_KEYS, set(ec2) - EC2_CONFIG_KEYS
    kwargs = doc["vcdl"]["ec2_cluster_kwargs"]
    assert set(kwargs) <= CLUSTER_KWARGS, set(kwargs) - CLUSTER_KWARGS
    assert kwargs["spot"] is True  # EC2Cluster(spot=True): workers only
    # instance_type decides GPU handling for every VM; the VMs' own types come
    # from scheduler_/worker_instance_type (default t2.micro) when set in config.
    types = {ec2[k] for k in ("instance_type", "scheduler_instance_type", "worker_instance_type")}
    assert all(t.startswith(("g", "p")) for t in types), types
    assert ec2["security_groups"], "without it EC2Cluster opens 8786/8787 to the internet"
    assert ec2["use_private_ip"] is True
    assert ec2["docker_image"].endswith("vcdl:0.1.0")
    assert kwargs["worker_options"] == {"nthreads": 1, "resources": {"GPU": 1}}
    assert "PREFECT_API_URL" in kwargs["env_vars"]


def test_gcp_config_preemptible_workers_and_known_keys() -> None:
    doc = _one(GCP)
    gcp = doc["cloudprovider"]["gcp"]
    assert set(gcp) <= GCP_CONFIG_KEYS, set(gcp) - GCP_CONFIG_KEYS
    kwargs = doc["vcdl"]["gcp_cluster_kwargs"]
    assert set(kwargs) <= CLUSTER_KWARGS, set(kwargs) - CLUSTER_KWARGS
    assert gcp["preemptible"] is True  # GCPScheduler drops it: workers only
    assert gcp["on_host_maintenance"] == "TERMINATE"
    # Integers: GCPCluster compares them with 0 (the defaults are "").
    assert gcp["scheduler_ngpus"] == 0 and gcp["worker_ngpus"] == 1
    assert gcp["worker_gpu_type"]
    assert gcp["public_ingress"] is False
    assert kwargs["worker_options"] == {"nthreads": 1, "resources": {"GPU": 1}}
    assert "PREFECT_API_URL" in kwargs["env_vars"]


@pytest.mark.parametrize("path", [EC2, GCP], ids=lambda p: p.name)
def test_cloud_env_vars_hold_no_secrets(path: Path) -> None:
    # env_vars are written into the VMs' user data / metadata.
    kwargs = next(iter(_one(path)["vcdl"].values()))
    assert not [k for k in kwargs["env_vars"] if SECRET_NAME.search(k)]


# --- Dockerfile -----------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_dockerfile_base_constraints_and_user() -> None:
    ins = _instructions()
    assert [arg for op, arg in ins if op == "FROM"] == ["python:3.11-slim"]
    runs = [arg for op, arg in ins if op == "RUN"]
    assert any(
        "pip install" in r and "-c constraints.txt" in r and ".[postgres]" in r for r in runs
    )
    # torch from the build arg's wheel index, pinned by the same constraints
    torch = [r for r in runs if re.search(r"\btorch\b", r) and "pip install" in r]
    assert torch and '--index-url "${TORCH_INDEX_URL}"' in torch[0]
    assert "-c constraints.txt" in torch[0]
    args = dict(a.split("=", 1) for op, a in ins if op == "ARG" and "=" in a)
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu12\d", args["TORCH_INDEX_URL"])
    users = [arg for op, arg in ins if op == "USER"]
    assert users, "the image must not run as root"
    uid = users[-1].split(":")[0]
    assert uid not in ("root", "0") and int(uid) == IMAGE_UID
    assert ins[-2] == ("ENTRYPOINT", '["/usr/bin/tini", "-g", "--"]')
    assert ins[-1][0] == "CMD" and json.loads(ins[-1][1])[0] == "vcdl"


def test_dockerfile_copies_exist_and_pass_the_ignore_file() -> None:
    sources = []
    for op, arg in _instructions():
        if op == "COPY":
            sources += arg.split()[:-1]
    assert set(sources) == {"constraints.txt", "pyproject.toml", "README.md", "vcdl", "flows"}
    kept = {
        line[1:].rstrip("/")
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    for src in sources:
        assert (REPO / src).exists(), src
        assert src in kept, f"{src} is excluded from the build context"


# --- docs/spot-fleet.md -----------------------------------------------------------


def _toml_blocks(path: Path) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_spot_fleet_run_config_is_valid_today() -> None:
    every = _toml_blocks(SPOT_DOC)
    for block in every:  # fragments too (a [fault] section alone): valid as they are
        parse_config(tomllib.loads(block))
    # The whole run configs: a fleet's cluster, store and ledger.
    # (The TLS variant is checked by tests/unit/test_spot_fleet_tls.py and run by test_tls.py.)
    blocks = [b for b in every if "task_resources" not in b and "[cluster]" in b]
    blocks = [b for b in blocks if "tls://" not in b]
    assert blocks
    for block in blocks:
        cfg = parse_config(tomllib.loads(block))
        assert cfg.cluster.address and cfg.cluster.address.startswith("tcp://")
        assert cfg.store.url and cfg.store.url.startswith("s3://")
        assert cfg.ledger.url and cfg.ledger.url.startswith("postgresql+psycopg://")
        assert "@" in cfg.ledger.url and not URL_PASSWORD.search(cfg.ledger.url)
        assert not cfg.store.storage_options, "credentials come from the AWS chain"
    for block in _toml_blocks(INFRA / "README.md"):
        parse_config(tomllib.loads(block))


def test_spot_fleet_gpu_keys_are_accepted() -> None:
    # The doc's GPU example must be a valid run config with what it shows.
    (block,) = [b for b in _toml_blocks(SPOT_DOC) if "task_resources" in b]
    cfg = parse_config(tomllib.loads(block))
    assert cfg.cluster.task_resources == {"GPU": 1}
    assert cfg.train.device == "auto" and cfg.train.amp
