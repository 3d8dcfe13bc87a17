#!/usr/bin/env python3
"""Static checks of deploy/monitoring that promtool does not do (run by tests/rules/run.sh).

usage: check_monitoring.py REPO_ROOT DASHBOARD_RULES_OUT

- Every YAML file in deploy/monitoring and deploy/exporter parses.
- prometheusrule.yaml's spec equals kgpu-alerts.rules.yaml (after parsing; run.sh also diffs
  the text against a fresh gen-prometheusrule.sh output).
- Every alert has a severity label, summary/description/runbook annotations, and at least one
  promtool test case where it fires and one where it must not.
- The manifests agree with each other: Service/ServiceMonitor/DaemonSet ports, selectors and
  labels, the exporter's flags, mounts and probe, kustomization resources.
- The Grafana dashboard: schemaVersion >= 36, the ${DS_PROMETHEUS} data source on every panel
  and query, the template variables, unique panel ids, a refId on every query. Its PromQL
  expressions are written to DASHBOARD_RULES_OUT as recording rules, one per query, named
  dashboard:panel<id>_<refId>, with the Grafana variables replaced by the values of the
  dashboard's defaults (All: `.*`; $__range 1h, $__rate_interval 2m). run.sh compares that file
  with tests/rules/dashboard.rules.yaml, which tests/rules/dashboard.test.yaml evaluates with
  promtool test rules (and check_golden.py against the golden scrapes).

Exit status 1 with one line per problem.
"""

import glob
import json
import os
import sys

import yaml

problems = []


def problem(msg):
    problems.append(msg)


def load_yaml_docs(path):
    try:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except yaml.YAMLError as e:
        problem(f"{path}: does not parse as YAML: {e}")
        return []
    if not docs:
        problem(f"{path}: empty")
    return docs


def check_rules(mon, tests_dir):
    plain_path = os.path.join(mon, "kgpu-alerts.rules.yaml")
    crd_path = os.path.join(mon, "prometheusrule.yaml")
    plain = load_yaml_docs(plain_path)
    crd = load_yaml_docs(crd_path)
    if len(plain) != 1 or len(crd) != 1:
        problem("kgpu-alerts.rules.yaml and prometheusrule.yaml must each be one YAML document")
        return
    plain, crd = plain[0], crd[0]
    if crd.get("apiVersion") != "monitoring.coreos.com/v1" or crd.get("kind") != "PrometheusRule":
        problem(f"{crd_path}: not a monitoring.coreos.com/v1 PrometheusRule")
    if crd.get("metadata", {}).get("namespace") != "kgpu-system":
        problem(f"{crd_path}: namespace is not kgpu-system")
    if crd.get("spec") != plain:
        problem(f"{crd_path}: spec differs from kgpu-alerts.rules.yaml; run deploy/monitoring/gen-prometheusrule.sh")
    groups = plain.get("groups") or []
    if [g.get("name") for g in groups] != ["kgpu-gpu"]:
        problem(f"{plain_path}: expected exactly one group, kgpu-gpu")

    alerts = {}
    for g in groups:
        for r in g.get("rules") or []:
            name = r.get("alert")
            if not name:
                problem(f"{plain_path}: rule without `alert:` ({r.get('record') or r.get('expr')})")
                continue
            alerts[name] = r
            sev = (r.get("labels") or {}).get("severity")
            if sev not in ("warning", "critical"):
                problem(f"{plain_path}: {name}: severity must be warning or critical (got {sev!r})")
            ann = r.get("annotations") or {}
            for key in ("summary", "description", "runbook"):
                if not ann.get(key):
                    problem(f"{plain_path}: {name}: no {key} annotation")
            text = " ".join(str(ann.get(k, "")) for k in ("summary", "description"))
            for label in ("Hostname", "gpu", "UUID"):
                if "$labels." + label not in text:
                    problem(f"{plain_path}: {name}: summary/description do not name {label}")
            if "$labels.pod" not in text or "$labels.namespace" not in text:
                problem(f"{plain_path}: {name}: summary/description do not name namespace/pod")

    fires, silent = set(), set()
    test_files = sorted(glob.glob(os.path.join(tests_dir, "*.test.yaml")))
    if not test_files:
        problem(f"{tests_dir}: no *.test.yaml")
    for path in test_files:
        for doc in load_yaml_docs(path):
            for t in doc.get("tests") or []:
                for case in t.get("alert_rule_test") or []:
                    name = case.get("alertname")
                    if name not in alerts:
                        problem(f"{path}: tests unknown alert {name!r}")
                    (fires if case.get("exp_alerts") else silent).add(name)
    for name in alerts:
        if name not in fires:
            problem(f"no test case where {name} fires")
        if name not in silent:
            problem(f"no test case where {name} must not fire")


def by_kind(docs):
    out = {}
    for path, d in docs:
        out.setdefault(d.get("kind"), []).append((path, d))
    return out


def check_manifests(mon):
    # The exporter's own manifests (DaemonSet, Service) are the component deploy/exporter; the
    # Prometheus Operator objects are the component deploy/monitoring. Each directory's
    # kustomization.yaml (kind Component) must list exactly its files.
    exporter = os.path.join(os.path.dirname(mon), "exporter")
    docs = []
    kusts = []
    for d_ in (mon, exporter):
        for path in sorted(glob.glob(os.path.join(d_, "*.yaml"))):
            for d in load_yaml_docs(path):
                if not isinstance(d, dict):
                    problem(f"{path}: a document is not a mapping")
                    continue
                if os.path.basename(path) == "kgpu-alerts.rules.yaml":
                    continue
                if "apiVersion" not in d or "kind" not in d:
                    problem(f"{path}: a document has no apiVersion/kind")
                    continue
                if d["kind"] == "Component":
                    kusts.append((d_, d))
                else:
                    docs.append((path, d))
    kinds = by_kind(docs)

    def one(kind):
        items = kinds.get(kind, [])
        if len(items) != 1:
            problem(f"expected exactly one {kind} in deploy/monitoring and deploy/exporter, found {len(items)}")
            return None
        return items[0][1]

    ds, svc, sm = one("DaemonSet"), one("Service"), one("ServiceMonitor")
    if len(kusts) != 2:
        problem(f"expected a kustomization.yaml of kind Component in each of {mon} and {exporter}")
    for path, d in docs:
        if d["kind"] != "Namespace" and d.get("metadata", {}).get("namespace") != "kgpu-system":
            problem(f"{path}: {d['kind']} is not in namespace kgpu-system")
        if d["kind"] == "Namespace":
            problem(f"{path}: the namespace belongs to deploy/namespace, not to a component")

    for dir_, kust in kusts:
        listed = set(kust.get("resources") or [])
        for r in listed:
            if not os.path.exists(os.path.join(dir_, r)):
                problem(f"{dir_}/kustomization.yaml: resource {r} does not exist")
        for path, d in docs:
            base = os.path.basename(path)
            if os.path.dirname(path) == dir_ and base not in listed:
                problem(f"{dir_}/kustomization.yaml does not list {base}")
        for gen in kust.get("configMapGenerator") or []:
            for f in gen.get("files") or []:
                if not os.path.exists(os.path.join(dir_, f.split("=")[-1])):
                    problem(f"{dir_}/kustomization.yaml: configMapGenerator file {f} does not exist")

    if not (ds and svc and sm):
        return
    pod = ds["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    if any(pod_labels.get(k) != v for k, v in ds["spec"]["selector"]["matchLabels"].items()):
        problem("DaemonSet: selector does not match its pod template labels")
    if any(pod_labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
        problem("Service: selector does not match the exporter pods")
    if svc["spec"].get("clusterIP") != "None":
        problem("Service: must be headless (clusterIP: None)")
    svc_ports = {p.get("name"): p for p in svc["spec"]["ports"]}
    if svc_ports.get("metrics", {}).get("port") != 9400:
        problem("Service: no port 9400 named metrics")
    if any(svc["metadata"]["labels"].get(k) != v for k, v in sm["spec"]["selector"]["matchLabels"].items()):
        problem("ServiceMonitor: selector does not match the Service's labels")
    eps = sm["spec"]["endpoints"]
    if len(eps) != 1:
        problem("ServiceMonitor: expected one endpoint")
    else:
        ep = eps[0]
        want = {"port": "metrics", "path": "/metrics", "interval": "30s", "honorLabels": True}
        for k, v in want.items():
            if ep.get(k) != v:
                problem(f"ServiceMonitor: endpoint {k} is {ep.get(k)!r}, want {v!r}")
        if ep.get("port") not in svc_ports:
            problem("ServiceMonitor: endpoint port is not a Service port name")

    spec = pod["spec"]
    if spec.get("hostPID") is not True:
        problem("DaemonSet: hostPID must be true (per-pod attribution reads host PIDs' cgroups)")
    (c,) = spec["containers"]
    cmd = c.get("command", []) + c.get("args", [])
    want_cmd = ["kgpu", "exporter", "-a", ":9400", "-c", "30000", "-k", "--proc-root", "/host/proc"]
    if cmd != want_cmd:
        problem(f"DaemonSet: command is {cmd}, want {want_cmd}")
    if not c["image"].startswith("localhost/kgpu:"):
        problem(f"DaemonSet: image is {c['image']}, not the Dockerfile's localhost/kgpu:<version>")
    env = {e["name"]: e for e in c.get("env", [])}
    if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        problem("DaemonSet: NODE_NAME must come from spec.nodeName")
    for name in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"):
        if env.get(name, {}).get("value") != "all":
            problem(f"DaemonSet: {name} must be all")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    if ports.get(svc_ports.get("metrics", {}).get("targetPort")) != 9400:
        problem("DaemonSet: the Service's targetPort is not container port 9400")
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/health" or probe.get("port") not in (9400, "metrics"):
        problem("DaemonSet: readiness probe must be GET /health on 9400")
    res = c.get("resources", {})
    if res.get("requests") != {"cpu": "10m", "memory": "16Mi"} or res.get("limits") != {"memory": "64Mi"}:
        problem(f"DaemonSet: resources are {res}")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    want_mounts = {  # mountPath -> (hostPath, readOnly)
        "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", None),
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", True),
        "/host/proc": ("/proc", True),
    }
    for mount_path, (host_path, read_only) in want_mounts.items():
        m = mounts.get(mount_path)
        if not m:
            problem(f"DaemonSet: nothing mounted at {mount_path}")
            continue
        hp = vols.get(m["name"], {}).get("hostPath", {})
        if hp.get("path") != host_path or hp.get("type") != "Directory":
            problem(f"DaemonSet: {mount_path} must be the host directory {host_path}")
        if read_only and m.get("readOnly") is not True:
            problem(f"DaemonSet: {mount_path} must be mounted read-only")


GRAFANA_VARS = [  # the dashboard's defaults: every variable at All (.*), a range of 1h
    ("$__rate_interval", "2m"), ("$__interval", "1m"), ("$__range", "1h"),
    ("$Hostname", ".*"), ("$gpu", ".*"), ("$namespace", ".*"), ("$pod", ".*"),
]


def check_dashboard(mon, rules_out):
    path = os.path.join(mon, "grafana-dashboard.json")
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        problem(f"{path}: {e}")
        return
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        problem(f"{path}: schemaVersion must be >= 36")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    if variables.get("DS_PROMETHEUS", {}).get("type") != "datasource":
        problem(f"{path}: no data source variable DS_PROMETHEUS")
    for name in ("Hostname", "gpu", "namespace", "pod"):
        if name not in variables:
            problem(f"{path}: no template variable {name}")
    for name, v in variables.items():
        if v.get("type") == "query" and v.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
            problem(f"{path}: variable {name} does not use ${{DS_PROMETHEUS}}")

    panels = []

    def walk(ps):
        for p in ps:
            panels.append(p)
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)):
        problem(f"{path}: duplicate panel ids")
    exprs = []
    for p in panels:
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
            problem(f"{path}: panel {p.get('title')!r} does not use ${{DS_PROMETHEUS}}")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                problem(f"{path}: a query of {p.get('title')!r} does not use ${{DS_PROMETHEUS}}")
            if not t.get("refId"):
                problem(f"{path}: a query of {p.get('title')!r} has no refId")
            exprs.append((p.get("id"), p.get("title"), t.get("refId", ""), t.get("expr", "")))
    text = json.dumps(dash)
    for family in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                   "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
                   "DCGM_EXP_XID_ERRORS_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "kgpu_gpu_up",
                   "kgpu_gpu_unhealthy_reason"):
        if family not in text:
            problem(f"{path}: no panel shows {family}")

    rules = []
    for pid, title, ref, expr in exprs:
        e = expr
        for var, value in GRAFANA_VARS:
            e = e.replace(var, value)
        if "$" in e:
            problem(f"{path}: panel {title!r}: unknown variable in {expr!r}")
        rules.append({"record": f"dashboard:panel{pid}_{ref}", "expr": e})
    with open(rules_out, "w", encoding="utf-8") as f:
        f.write("# GENERATED by tests/rules/check_monitoring.py from deploy/monitoring/grafana-dashboard.json:\n"
                "# DO NOT EDIT. One recording rule per dashboard query (dashboard:panel<id>_<refId>), the\n"
                "# variables at the dashboard's defaults (All, a 1h range), for promtool test rules\n"
                "# (tests/rules/dashboard.test.yaml) and check_golden.py. Regenerate:\n"
                "#   python3 tests/rules/check_monitoring.py . tests/rules/dashboard.rules.yaml\n")
        yaml.safe_dump({"groups": [{"name": "grafana-dashboard", "rules": rules}]}, f, sort_keys=False, width=1000)
    print(f"check_monitoring: {len(exprs)} dashboard expressions written to {rules_out}")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, rules_out = sys.argv[1], sys.argv[2]
    mon = os.path.join(root, "deploy", "monitoring")
    check_rules(mon, os.path.join(root, "tests", "rules"))
    check_manifests(mon)
    check_dashboard(mon, rules_out)
    for p in problems:
        print(f"check_monitoring: {p}", file=sys.stderr)
    if problems:
        return 1
    print("check_monitoring: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
