#!/usr/bin/env python3
"""Checks that the objects `kubectl kustomize deploy` renders make one working install.

  check_rendered.py RENDERED.yaml VARIANT VERSION OUT.json

VARIANT: default (deploy/kustomization.yaml: no monitoring.coreos.com object, so that it applies
without the Prometheus Operator), monitoring (deploy plus the component deploy/monitoring),
all (every component: monitoring, node in place of the device plugin's and the exporter's
DaemonSets, node-labels, the Slurm bridge's Deployment and the admission webhook), shares (the
plugin labelling its Node and serving kgpu.io/gpu for kgpu extender, with the webhook:
check_shares), quota (deploy/quota, checked by check_quota below) or dra (deploy/dra, check_dra). Checks: the expected objects and no
others; one Namespace, everything else in it; every image is `make image`'s
localhost/kgpu:VERSION, the placeholder tag set by images: (the Slurm bridge:
localhost/kgpu-slurm-bridge:VERSION, built from deploy/slurm/bridge/Dockerfile) and names its user explicitly (root where it needs the kubelet's sockets,
else the image's unprivileged user with runAsNonRoot);
selectors match (DaemonSet and Deployment -> its pods, Service -> one workload's pods and a named port,
webhook configurations -> a rendered Service and port, never gating kube-system or kgpu-system,
ServiceMonitor -> the Service); ServiceAccounts, ConfigMaps and RBAC subjects that pods and
bindings name exist. Writes the objects as a JSON array to OUT.json for validate.mjs.
"""
import json
import sys

import yaml

NS = "kgpu-system"
COMMON = {
    ("Namespace", NS), ("ServiceAccount", "kgpu-device-plugin"), ("ClusterRole", "kgpu-device-plugin"),
    ("ClusterRoleBinding", "kgpu-device-plugin"), ("ConfigMap", "kgpu-device-plugin-config"),
    ("Service", "kgpu-exporter"),
}
# The optional component deploy/monitoring: the Prometheus Operator's objects and the dashboard.
MONITORING = {("ConfigMap", "kgpu-grafana-dashboard"), ("PrometheusRule", "kgpu-gpu-alerts"),
              ("ServiceMonitor", "kgpu-exporter")}
# The API group only the Prometheus Operator's CRDs serve.
OPERATOR_GROUP = "monitoring.coreos.com/"
EXPECTED = {
    "default": COMMON | {("DaemonSet", "kgpu-device-plugin"), ("DaemonSet", "kgpu-exporter")},
    "monitoring": COMMON | MONITORING | {("DaemonSet", "kgpu-device-plugin"), ("DaemonSet", "kgpu-exporter")},
    "all": COMMON | MONITORING | {("DaemonSet", "kgpu-node"), ("DaemonSet", "kgpu-node-labels"),
                     ("ServiceAccount", "kgpu-node-labels"), ("ClusterRole", "kgpu-node-labels"),
                     ("ClusterRoleBinding", "kgpu-node-labels"),
                     ("Deployment", "kgpu-slurm-bridge"), ("ServiceAccount", "kgpu-slurm-bridge"),
                     ("ClusterRole", "kgpu-slurm-bridge"), ("ClusterRoleBinding", "kgpu-slurm-bridge"),
                     ("Role", "kgpu-slurm-bridge-leader"), ("RoleBinding", "kgpu-slurm-bridge-leader"),
                     ("Deployment", "kgpu-webhook"), ("ServiceAccount", "kgpu-webhook"), ("Service", "kgpu-webhook"),
                     ("MutatingWebhookConfiguration", "kgpu-webhook"),
                     ("ValidatingWebhookConfiguration", "kgpu-webhook")},
    "shares": COMMON | MONITORING | {("DaemonSet", "kgpu-device-plugin"), ("DaemonSet", "kgpu-exporter"),
                        ("ClusterRole", "kgpu-device-plugin-labels"), ("ClusterRoleBinding", "kgpu-device-plugin-labels"),
                        ("ClusterRole", "kgpu-device-plugin-shares"), ("ClusterRoleBinding", "kgpu-device-plugin-shares"),
                        ("Deployment", "kgpu-webhook"), ("ServiceAccount", "kgpu-webhook"), ("Service", "kgpu-webhook"),
                        ("MutatingWebhookConfiguration", "kgpu-webhook"),
                        ("ValidatingWebhookConfiguration", "kgpu-webhook"),
                        # exporter/pod-metadata: pod labels on the exporter's series
                        ("ServiceAccount", "kgpu-exporter"), ("ClusterRole", "kgpu-exporter-pod-metadata"),
                        ("ClusterRoleBinding", "kgpu-exporter-pod-metadata"), ("Role", "kgpu-exporter-counters"),
                        ("RoleBinding", "kgpu-exporter-counters")},
}
# Workloads whose image is not the plain kgpu image (it lacks what they spawn).
IMAGES = {("Deployment", "kgpu-slurm-bridge"): "localhost/kgpu-slurm-bridge"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration"}

problems = []

# deploy/quota: per team namespace, a Namespace, a ResourceQuota gpu and a LimitRange gpu.
QUOTA_TEAMS = ["team-a", "team-b", "team-c", "tenant-1", "tenant-2"]
QUOTA_EXPECTED = ({("Namespace", "", t) for t in QUOTA_TEAMS} | {("ResourceQuota", t, "gpu") for t in QUOTA_TEAMS}
                  | {("LimitRange", t, "gpu") for t in QUOTA_TEAMS})
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-", "kgpu.io/")


def is_gpu(name):
    return name.startswith(GPU_RESOURCES)


def check_quota(objs):
    """deploy/quota: the expected objects; quotas that the apiserver enforces (requests.<name> for
    extended resources: limits.<name> is accepted but never checked) and that close the GPU kinds a
    team may not use (every quota names the same GPU resources); LimitRange items whose GPU
    defaults equal their default requests (required for extended resources) and never hand a GPU to
    a container that asked for none (a default is added to every container)."""
    have = {(o.get("kind"), o.get("metadata", {}).get("namespace", ""), o.get("metadata", {}).get("name"))
            for o in objs}
    for k in sorted(QUOTA_EXPECTED - have):
        problem(f"missing {k[0]} {k[1]}/{k[2]}")
    for k in sorted(have - QUOTA_EXPECTED):
        problem(f"unexpected {k[0]} {k[1]}/{k[2]}")
    names = None
    for o in objs:
        n = f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
        if o["kind"] == "ResourceQuota":
            hard = o["spec"]["hard"]
            gpu = set()
            for k, v in hard.items():
                if not isinstance(v, str):
                    problem(f"{n}: spec.hard[{k}] must be a quoted string (got {v!r})")
                if k.startswith("limits.") and is_gpu(k[len("limits."):]):
                    problem(f"{n}: {k} is never enforced for an extended resource; use requests.{k[len('limits.'):]}")
                if k.startswith("requests.") and is_gpu(k[len("requests."):]):
                    gpu.add(k)
            if names is None:
                names = (n, gpu)
            elif gpu != names[1]:
                problem(f"{n}: names the GPU resources {sorted(gpu)}, {names[0]} names {sorted(names[1])} "
                        "(a resource left out of a quota is unlimited there)")
        elif o["kind"] == "LimitRange":
            for i, item in enumerate(o["spec"]["limits"]):
                for k, v in item.get("max", {}).items():
                    if not is_gpu(k):
                        continue
                    d, dr = item.get("default", {}).get(k), item.get("defaultRequest", {}).get(k)
                    if d is None or dr is None:
                        problem(f"{n}: limits[{i}].max[{k}] without default and defaultRequest: the apiserver "
                                "defaults them from max and gives every container that much")
                    elif d != dr:
                        problem(f"{n}: limits[{i}] default[{k}]={d} differs from defaultRequest {dr}")
                    elif d != "0":
                        problem(f"{n}: limits[{i}].default[{k}]={d} would be added to every container, CPU-only "
                                "ones included; use \"0\"")


def problem(msg):
    problems.append(msg)


# deploy/dra: NVIDIA's DeviceClasses by name and selector (a drop-in for claims written for
# NVIDIA's driver) and kgpu's share class, each selecting the driver kgpu publishes by default.
DRA_CLASSES = {
    "gpu.nvidia.com": "device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.attributes['gpu.nvidia.com'].type == 'mig'",
    "gpu-share.kgpu.io": "device.allowMultipleAllocations",
}


def check_dra(objs, version):
    """deploy/dra: the three DeviceClasses (cluster-scoped, resource.k8s.io/v1, each selecting the
    gpu.nvidia.com driver and its device type) and the driver: its ServiceAccount, RBAC, ConfigMap and
    DaemonSet in kgpu-system, running make image's localhost/kgpu:VERSION with kubelet's plugin
    directories mounted at the host's paths."""
    want = {("DeviceClass", n) for n in DRA_CLASSES} | {
        ("ServiceAccount", "kgpu-dra"), ("ClusterRole", "kgpu-dra"), ("ClusterRoleBinding", "kgpu-dra"),
        ("ConfigMap", "kgpu-dra-config"), ("DaemonSet", "kgpu-dra")}
    have = {(o.get("kind"), o["metadata"]["name"]) for o in objs}
    for k in sorted(want - have):
        problem(f"deploy/dra: missing {k[0]} {k[1]}")
    for k in sorted(have - want):
        problem(f"deploy/dra: unexpected {k[0]} {k[1]}")
    for o in objs:
        name = o["metadata"]["name"]
        ns = o["metadata"].get("namespace")
        if o.get("kind") in CLUSTER_SCOPED or o.get("kind") == "DeviceClass":
            if ns:
                problem(f"{o['kind']} {name} is cluster-scoped but has namespace {ns}")
        elif ns != NS:
            problem(f"{o['kind']} {name} is in namespace {ns!r}, not {NS}")
        if o.get("kind") != "DeviceClass":
            continue
        if o.get("apiVersion") != "resource.k8s.io/v1":
            problem(f"DeviceClass {name}: apiVersion {o.get('apiVersion')}, not resource.k8s.io/v1")
        exprs = [s.get("cel", {}).get("expression", "") for s in o.get("spec", {}).get("selectors", [])]
        want_expr = DRA_CLASSES.get(name, "")
        if not any("device.driver == 'gpu.nvidia.com'" in e and want_expr in e for e in exprs):
            problem(f"DeviceClass {name}: no selector with device.driver == 'gpu.nvidia.com' && {want_expr}: {exprs}")
    if next((o for o in objs if o["metadata"]["name"] == "gpu.nvidia.com"), {}).get("spec", {}).get(
            "extendedResourceName") != "nvidia.com/gpu":
        problem("DeviceClass gpu.nvidia.com: extendedResourceName is not nvidia.com/gpu (NVIDIA's chart sets it on v1)")
    for ds in (o for o in objs if o.get("kind") == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        if c.get("image") != f"localhost/kgpu:{version}":
            problem(f"DaemonSet kgpu-dra runs {c.get('image')}, not make image's localhost/kgpu:{version}")
        if c.get("command", [])[:2] != ["kgpu", "dra"]:
            problem(f"DaemonSet kgpu-dra runs {c.get('command')}, not kgpu dra")
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod.get("volumes", [])}
        for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"):
            if not any(mounts.get(n) == path == host.get(n) for n in mounts):
                problem(f"DaemonSet kgpu-dra does not mount the host's {path} at the same path")
        if pod.get("serviceAccountName") != "kgpu-dra":
            problem("DaemonSet kgpu-dra does not run as ServiceAccount kgpu-dra")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    path, variant, version, out = sys.argv[1:]
    with open(path, encoding="utf-8") as f:
        objs = [d for d in yaml.safe_load_all(f) if d is not None]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(objs, f)

    if variant in ("quota", "dra"):
        if variant == "quota":
            check_quota(objs)
        else:
            check_dra(objs, version)
        for p in problems:
            print(f"check_rendered ({variant}): {p}")
        print(f"check_rendered ({variant}): {len(objs)} objects, {len(problems)} problem(s)")
        return 1 if problems else 0

    have = {(o.get("kind"), o.get("metadata", {}).get("name")) for o in objs}
    if len(have) != len(objs):
        problem("two objects have the same kind and name")
    want = EXPECTED[variant]
    for k in sorted(want - have):
        problem(f"missing {k[0]} {k[1]}")
    for k in sorted(have - want):
        problem(f"unexpected {k[0]} {k[1]}")
    # `kubectl apply -k deploy` must work on a cluster without the Prometheus Operator.
    if variant == "default":
        for o in objs:
            if str(o.get("apiVersion", "")).startswith(OPERATOR_GROUP):
                problem(f"{o['kind']} {o['metadata']['name']}: the default install renders a {o['apiVersion']} object, "
                        "which needs the Prometheus Operator's CRDs (keep deploy/monitoring an optional component)")
    elif not any(str(o.get("apiVersion", "")).startswith(OPERATOR_GROUP) for o in objs):
        problem(f"the {variant} variant includes deploy/monitoring but renders no {OPERATOR_GROUP} object")

    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
        ns = o.get("metadata", {}).get("namespace")
        if o["kind"] in CLUSTER_SCOPED:
            if ns:
                problem(f"{o['kind']} {o['metadata']['name']} is cluster-scoped but has namespace {ns}")
        elif ns != NS:
            problem(f"{o['kind']} {o['metadata']['name']} is in namespace {ns!r}, not {NS}")
    names = lambda kind: {o["metadata"]["name"] for o in by_kind.get(kind, [])}  # noqa: E731

    daemonsets = by_kind.get("DaemonSet", [])
    for ds in daemonsets + by_kind.get("Deployment", []):
        kind = ds["kind"]
        n = f"{kind} {ds['metadata']['name']}"
        image = f"{IMAGES.get((kind, ds['metadata']['name']), 'localhost/kgpu')}:{version}"
        tmpl = ds["spec"]["template"]
        if not selects(ds["spec"]["selector"].get("matchLabels"), tmpl["metadata"].get("labels", {})):
            problem(f"{n}: selector does not match its pod template")
        spec = tmpl["spec"]
        sa = spec.get("serviceAccountName")
        if sa and sa not in names("ServiceAccount"):
            problem(f"{n}: ServiceAccount {sa} is not rendered")
        for v in spec.get("volumes", []):
            cm = v.get("configMap", {}).get("name")
            if cm and cm not in names("ConfigMap"):
                problem(f"{n}: volume {v['name']} names ConfigMap {cm}, which is not rendered")
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c.get("image") != image:
                problem(f"{n}: container {c['name']} runs {c.get('image')}, not {image} "
                        "(make image's image; images: in the kustomization sets the tag to project(VERSION))")
            sc = c.get("securityContext", {})
            user = sc.get("runAsUser")
            if user is None:
                problem(f"{n}: container {c['name']} must set runAsUser (0 for the kubelet's sockets, "
                        "the image's default user is the unprivileged kgpu)")
            elif user != 0 and sc.get("runAsNonRoot") is not True:
                problem(f"{n}: container {c['name']} runs as uid {user} but does not set runAsNonRoot")
            if sc.get("allowPrivilegeEscalation") is not False or sc.get("capabilities", {}).get("drop") != ["ALL"]:
                problem(f"{n}: container {c['name']} must drop all capabilities, no privilege escalation")

    workloads = daemonsets + by_kind.get("Deployment", [])
    for svc in by_kind.get("Service", []):
        n = svc["metadata"]["name"]
        sel = svc["spec"].get("selector", {})
        matched = [w for w in workloads if selects(sel, w["spec"]["template"]["metadata"].get("labels", {}))]
        if len(matched) != 1:
            problem(f"Service {n}: selector {sel} matches {len(matched)} workloads' pods, want 1")
            continue
        ports = {p.get("name") for c in matched[0]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for p in svc["spec"].get("ports", []):
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in ports:
                problem(f"Service {n}: targetPort {p['targetPort']} is not a port of {matched[0]['metadata']['name']}")
    # Admission webhooks call a rendered Service on a port it has, and are never allowed to gate
    # the namespaces their own pods (and the control plane's) live in.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for cfg in by_kind.get(kind, []):
            for w in cfg.get("webhooks", []):
                n = f"{kind} {cfg['metadata']['name']} webhook {w.get('name')}"
                ref = w.get("clientConfig", {}).get("service", {})
                svc = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == ref.get("name")]
                if ref.get("namespace") != NS or not svc:
                    problem(f"{n}: calls Service {ref.get('namespace')}/{ref.get('name')}, which is not rendered")
                elif ref.get("port", 443) not in {p.get("port") for p in svc[0]["spec"].get("ports", [])}:
                    problem(f"{n}: port {ref.get('port', 443)} is not a port of Service {ref.get('name')}")
                excluded = set()
                for e in w.get("namespaceSelector", {}).get("matchExpressions", []):
                    if e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn":
                        excluded |= set(e.get("values", []))
                if not {"kube-system", NS} <= excluded:
                    problem(f"{n}: namespaceSelector must exclude kube-system and {NS}")
                if w.get("sideEffects") != "None" or w.get("failurePolicy") not in ("Ignore", "Fail"):
                    problem(f"{n}: sideEffects None and an explicit failurePolicy are required")
    for sm in by_kind.get("ServiceMonitor", []):
        sel = sm["spec"].get("selector", {}).get("matchLabels", {})
        if not any(selects(sel, s["metadata"].get("labels", {})) for s in by_kind.get("Service", [])):
            problem(f"ServiceMonitor {sm['metadata']['name']}: selects no Service")
    for crb in by_kind.get("ClusterRoleBinding", []) + by_kind.get("RoleBinding", []):
        n = f"{crb['kind']} {crb['metadata']['name']}"
        ref = crb["roleRef"]
        if ref["name"] not in names(ref["kind"]):
            problem(f"{n}: {ref['kind']} {ref['name']} is not rendered")
        for s in crb.get("subjects", []):
            if s["kind"] == "ServiceAccount" and s["name"] not in names("ServiceAccount"):
                problem(f"{n}: ServiceAccount {s['name']} is not rendered")

    if variant == "shares":
        check_shares(by_kind, version)
        check_exporter_pod_metadata(by_kind)
    for p in problems:
        print(f"check_rendered ({variant}): {p}")
    print(f"check_rendered ({variant}): {len(objs)} objects, {len(problems)} problem(s)")
    return 1 if problems else 0


def check_exporter_pod_metadata(by_kind):
    """exporter/pod-metadata: the exporter runs as kgpu-exporter with its token and the flag."""
    ds = [d for d in by_kind.get("DaemonSet", []) if d["metadata"]["name"] == "kgpu-exporter"][0]
    spec = ds["spec"]["template"]["spec"]
    if spec.get("serviceAccountName") != "kgpu-exporter" or spec.get("automountServiceAccountToken") is not True:
        problem("exporter/pod-metadata: the exporter does not run as kgpu-exporter with its token")
    if "--kubernetes-enable-pod-labels" not in spec["containers"][0].get("command", []):
        problem("exporter/pod-metadata: the exporter is not started with --kubernetes-enable-pod-labels")


def check_shares(by_kind, version):
    """The shares variant gives the plugin what the kgpu.io/gpu handoff needs at PreStart
    (src/cli/share_handoff.cc): a token, --publish-labels (the extender reads the inventory
    annotation), kubelet's PodResources socket, the CDI spec directory, RBAC for the pod and its
    Events, a config that serves kgpu.io/gpu, and the CUDA interposer of this version on the host
    (an init container copies the kgpu package's into a directory of the version, mounted at the
    same path, and KGPU_CUDA_INTERPOSER names it)."""
    ds = [d for d in by_kind.get("DaemonSet", []) if d["metadata"]["name"] == "kgpu-device-plugin"][0]
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    if spec.get("automountServiceAccountToken") is not True:
        problem("shares: the device plugin needs its service-account token")
    if "--publish-labels" not in c.get("command", []):
        problem("shares: the device plugin must publish its labels and inventory (--publish-labels)")
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    for path in ("/var/lib/kubelet/pod-resources", "/var/run/cdi"):
        if path not in mounts:
            problem(f"shares: the device plugin does not mount {path}")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    lib = env.get("KGPU_CUDA_INTERPOSER", "")
    if lib != f"/var/lib/kgpu/isolation/{version}/libkgpu-cuda.so":
        problem(f"shares: KGPU_CUDA_INTERPOSER is {lib!r}, not the host directory of version {version}")
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec.get("volumes", [])}
    if not any(lib.startswith(m["mountPath"].rstrip("/") + "/") and host.get(m["name"]) == m["mountPath"]
               for m in c.get("volumeMounts", [])):
        problem(f"shares: {lib} is not under a host directory mounted at the same path")
    if not any(f"/usr/lib/kgpu/{version}/libkgpu-cuda.so" in " ".join(i.get("command", []))
               for i in spec.get("initContainers", [])):
        problem(f"shares: no init container copies /usr/lib/kgpu/{version}/libkgpu-cuda.so to the host")
    rules = [r for cr in by_kind.get("ClusterRole", []) for r in cr.get("rules", [])
             if cr["metadata"]["name"].startswith("kgpu-device-plugin")]
    def allowed(group, resource, verb):
        return any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
                   and verb in r.get("verbs", []) for r in rules)
    # list pods: its node's pods (fieldSelector spec.nodeName), to steer kubelet to the records'
    # whole GPUs at GetPreferredAllocation (docs/sharing-model.md §5).
    for group, resource, verb in (("", "pods", "get"), ("", "pods", "list"), ("", "pods", "patch"), ("", "nodes", "get"),
                                  ("", "nodes", "patch"), ("", "nodes/status", "patch"), ("events.k8s.io", "events", "create"),
                                  ("events.k8s.io", "events", "patch")):
        if not allowed(group, resource, verb):
            problem(f"shares: the device plugin may not {verb} {resource} ({group or 'core'})")
    for group, resource, verb in (("", "pods", "watch"), ("", "pods", "delete")):
        if allowed(group, resource, verb):
            problem(f"shares: the device plugin may {verb} {resource}: more than it needs")
    cm = [m for m in by_kind.get("ConfigMap", []) if m["metadata"]["name"] == "kgpu-device-plugin-config"][0]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    res = config.get("sharing", {}).get("timeSlicing", {}).get("resources", [])
    if not any(r.get("rename") == "kgpu.io/gpu" and r.get("replicas", 0) >= 2 for r in res):
        problem("shares: the config serves no kgpu.io/gpu slots")


if __name__ == "__main__":
    sys.exit(main())
