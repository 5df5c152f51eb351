"""Asserts what matters in the manent chart's rendered output (scripts/check-deploy).

Usage: assert_rendered.py DEFAULT.yaml POOL.yaml MANENT_SERVER

DEFAULT.yaml is `helm template` with the default values, POOL.yaml with
deploy/helm/ci/pool-values.yaml. When MANENT_SERVER exists, every pod's manent.yml and
MANENT__/DBOS__ variables are given to `manent-server admin check-config`, so the chart
cannot render a configuration the server refuses.
"""

import os
import subprocess
import sys
import tempfile

import yaml


def load(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def find(docs, kind, name):
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} named {name} in the rendered chart")


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def seconds(duration):
    assert duration.endswith("s") and duration[:-1].isdigit(), f"unexpected duration {duration!r}"
    return int(duration[:-1])


def check_pod_security(kind_name, pod_spec):
    assert pod_spec["securityContext"]["runAsNonRoot"] is True, f"{kind_name}: pods must run as non-root"
    assert pod_spec["automountServiceAccountToken"] is False, f"{kind_name}: manent needs no Kubernetes API token"
    for container in pod_spec["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, f"{kind_name}: the root filesystem must be read-only"
        assert sc["allowPrivilegeEscalation"] is False, f"{kind_name}: no privilege escalation"
        assert sc["capabilities"]["drop"] == ["ALL"], f"{kind_name}: every capability dropped"


def check_database_from_secret(kind_name, container, secret_name, key):
    ref = env_of(container)["MANENT__DATABASE__URL"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (secret_name, key), (
        f"{kind_name}: the database URL must come from Secret {secret_name}/{key}, got {ref}"
    )


def check_worker_set(docs, name, secret, key):
    sts = find(docs, "StatefulSet", name)
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    vmid = env["DBOS__VMID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert vmid == "metadata.name", f"{name}: the executor id (DBOS__VMID) must be the pod name, got {vmid}"
    drain = seconds(env["MANENT__DBOS__DRAIN_TIMEOUT"]["value"])
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > drain, f"{name}: terminationGracePeriodSeconds {grace} must exceed the drain {drain}s"
    headless = find(docs, "Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None", f"{name}: its governing Service must be headless"
    assert headless["spec"]["selector"] == spec["selector"]["matchLabels"], f"{name}: the headless Service selects its pods"
    pdb = find(docs, "PodDisruptionBudget", name)
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"], f"{name}: a PDB covers its pods"
    assert container["args"][-1] == "worker", f"{name}: runs the worker role"
    check_pod_security(name, pod)
    check_database_from_secret(name, container, secret, key)
    return sts


def check_api(docs, secret, key):
    deployment = find(docs, "Deployment", "manent-api")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", "the API's liveness probe is /healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", "the API's readiness probe is /readyz"
    assert container["args"][-1] == "api", "the Deployment runs the api role"
    service = find(docs, "Service", "manent-api")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"], "the API Service selects the API pods"
    find(docs, "PodDisruptionBudget", "manent-api")
    check_pod_security("manent-api", pod)
    check_database_from_secret("manent-api", container, secret, key)


def check_config_accepted(docs, server, pod_name, workload, database_url):
    """The rendered manent.yml, with the pod's literal variables, passes check-config."""
    config = find(docs, "ConfigMap", "manent-config")["data"]["manent.yml"]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MANENT__", "DBOS__"))}
    for name, entry in env_of(container).items():
        if "value" in entry:
            env[name] = entry["value"]
    env["MANENT__DATABASE__URL"] = database_url
    has_vmid = "DBOS__VMID" in env_of(container)
    if has_vmid:
        env["DBOS__VMID"] = pod_name
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "manent.yml")
        with open(path, "w") as f:
            f.write(config)
        result = subprocess.run(
            [server, "-c", path, "admin", "check-config"], env=env, capture_output=True, text=True
        )
    assert result.returncode == 0, f"manent-server refused the chart's manent.yml for {pod_name}: {result.stderr}"
    if has_vmid:
        assert f"executor id {pod_name}" in result.stdout, f"{pod_name}: the executor id is the pod name: {result.stdout}"


def main():
    default_docs, pool_docs, server = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]

    check_api(default_docs, "manent-database", "url")
    workers = check_worker_set(default_docs, "manent", "manent-database", "url")
    secret = find(default_docs, "Secret", "manent-database")
    assert secret["stringData"]["url"].startswith("postgres://"), "the default database is PostgreSQL"

    check_api(pool_docs, "manent-db", "postgres-url")
    check_worker_set(pool_docs, "manent", "manent-db", "postgres-url")
    pool = check_worker_set(pool_docs, "manent-ansible", "manent-db", "postgres-url")
    assert not [d for d in pool_docs if d["kind"] == "Secret"], "with existingSecret the chart creates no Secret"
    (container,) = pool["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    assert "server-ansible" in container["image"], f"the ansible pool runs the server-ansible image, got {container['image']}"
    assert env["MANENT__DBOS__PLUGINS"]["value"] == "ansible", "the pool serves its plugins (dbos.plugins)"
    assert env["MANENT__DBOS__EXCLUSIVE"]["value"] == "true", "a pool is exclusive by default"
    pod = pool["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    assert grace == 150, f"drainTimeoutSeconds 120 + margin 30 gives 150, got {grace}"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "environments"]
    items = volume["configMap"]["items"]
    assert {"key": "demo.hello.dev.yml", "path": "demo/hello/dev.yml"} in items, f"environment files mounted at their paths: {items}"
    env_files = find(pool_docs, "ConfigMap", "manent-environments")["data"]
    assert "targets:" in env_files["demo.hello.dev.yml"], "the environment file's content is in the ConfigMap"
    assert find(pool_docs, "Ingress", "manent")["spec"]["rules"][0]["host"] == "manent.example.com", "the Ingress is rendered"

    if os.path.exists(server):
        check_config_accepted(default_docs, server, "manent-0", workers, "postgres://manent@db/manent")
        check_config_accepted(pool_docs, server, "manent-ansible-1", pool, "postgres://manent@db/manent")
        check_config_accepted(default_docs, server, "manent-api-0", find(default_docs, "Deployment", "manent-api"), "postgres://manent@db/manent")
    else:
        print(f"note: {server} not built; the rendered manent.yml was not given to manent-server", file=sys.stderr)
    print("rendered chart: every assertion holds", file=sys.stderr)


if __name__ == "__main__":
    main()
