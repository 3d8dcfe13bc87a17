#!/usr/bin/env python3
"""Checks that deploy/extender makes an extender only kube-scheduler can call, on a kubeadm cluster.

  check_extender.py RENDERED.yaml STATIC_CONFIG.yaml SECRETS.yaml OUT.json

RENDERED.yaml: `kubectl kustomize deploy/extender`. STATIC_CONFIG.yaml: deploy/extender/
kube-scheduler-config.yaml (the default kube-scheduler's variant). SECRETS.yaml: what
deploy/extender/gen-certs.sh wrote. Both documented variants are checked:
  - the default path (a second kube-scheduler Deployment in the cluster): it calls the Service by
    a name that resolves inside the cluster, over HTTPS, presenting the client certificate from a
    Secret gen-certs.sh makes, with percentageOfNodesToScore on its profile, not the global one;
  - the static-pod path (kube-scheduler-config.yaml): HTTPS with its tlsConfig in
    /etc/kubernetes/kgpu-extender-client, the percentage on a kgpu-scheduler profile only, and
    the default profile left as it was;
  - the extender: HTTPS with --tls-cert-file, --tls-key-file, --client-ca-file, and with
    --leader-elect --peer-cert-file/--peer-key-file, from the Secret gen-certs.sh makes (no
    --insecure-http); --advertise-address from the pod's IP (the downward API), so a standby can
    pass binds on to the leader; HTTPS probes; and a NetworkPolicy that lets only the
    kgpu-scheduler pods and the extender's own replicas reach its port.
Writes the rendered objects and the Secrets as a JSON array to OUT.json for validate.mjs.
"""
import json
import os
import re
import sys

import yaml

problems = []


def bad(msg):
    problems.append(msg)


def find(objs, kind, name):
    for o in objs:
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            return o
    bad(f"no {kind} {name}")
    return None


def mounted_secret(deploy, path):
    """The Secret whose volume the Deployment mounts at the directory of `path`, and the key."""
    spec = deploy["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            if os.path.dirname(path) == m["mountPath"].rstrip("/"):
                secret = volumes.get(m["name"], {}).get("secret")
                if secret:
                    return secret["secretName"], os.path.basename(path)
    bad(f"{deploy['metadata']['name']}: {path} is in no mounted Secret")
    return None, None


def check_key(secrets, name, key, what):
    s = secrets.get(name)
    if s is None:
        bad(f"{what}: Secret {name} is not one gen-certs.sh makes (it makes {sorted(secrets)})")
    elif key not in s.get("data", {}):
        bad(f"{what}: Secret {name} has no key {key} (it has {sorted(s.get('data', {}))})")


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def check_scheduler_config(cfg, where, svc_url, tls_dir=None):
    if "percentageOfNodesToScore" in cfg:
        bad(f"{where}: percentageOfNodesToScore is global (every pod of the scheduler): set it on the kgpu profile")
    profiles = {p.get("schedulerName"): p for p in cfg.get("profiles", [])}
    if profiles.get("kgpu-scheduler", {}).get("percentageOfNodesToScore") != 100:
        bad(f"{where}: no kgpu-scheduler profile with percentageOfNodesToScore: 100")
    for name, p in profiles.items():
        if name != "kgpu-scheduler" and "percentageOfNodesToScore" in p:
            bad(f"{where}: profile {name} changes percentageOfNodesToScore")
    exts = cfg.get("extenders", [])
    if len(exts) != 1:
        bad(f"{where}: {len(exts)} extenders, expected 1")
        return None
    e = exts[0]
    if not re.fullmatch(re.escape(svc_url) + r"/[a-z]+", e.get("urlPrefix", "")):
        bad(f"{where}: urlPrefix {e.get('urlPrefix')} is not {svc_url}/... (HTTPS to the extender's Service)")
    if e.get("ignorable") is not False:
        bad(f"{where}: ignorable must be false (a GPU pod never scheduled without the extender)")
    tls = e.get("tlsConfig", {})
    for field in ("certFile", "keyFile", "caFile"):
        if not tls.get(field):
            bad(f"{where}: tlsConfig.{field} missing: the extender requires kube-scheduler's client certificate")
        elif tls_dir and os.path.dirname(tls[field]) != tls_dir:
            bad(f"{where}: tlsConfig.{field} {tls[field]} is not in {tls_dir}")
    if tls.get("insecure"):
        bad(f"{where}: tlsConfig.insecure")
    return tls


def main():
    rendered, static, secrets_file, out = sys.argv[1:]
    objs = [o for o in yaml.safe_load_all(open(rendered, encoding="utf-8")) if o]
    secret_objs = [o for o in yaml.safe_load_all(open(secrets_file, encoding="utf-8")) if o]
    secrets = {o["metadata"]["name"]: o for o in secret_objs if o.get("kind") == "Secret"}
    ns = "kgpu-system"

    ext = find(objs, "Deployment", "kgpu-extender")
    sched = find(objs, "Deployment", "kgpu-scheduler")
    svc = find(objs, "Service", "kgpu-extender")
    policy = find(objs, "NetworkPolicy", "kgpu-extender")
    cm = find(objs, "ConfigMap", "kgpu-scheduler-config")
    if not (ext and sched and svc and policy and cm):
        return finish(objs + secret_objs, out)

    c = ext["spec"]["template"]["spec"]["containers"][0]
    args = c.get("args", [])
    if "--insecure-http" in args:
        bad("kgpu-extender: --insecure-http (any caller could bind pods)")
    flags = ["--tls-cert-file", "--tls-key-file", "--client-ca-file"]
    adv_port = None
    if "--leader-elect" in args:
        flags += ["--peer-cert-file", "--peer-key-file"]
        adv = args[args.index("--advertise-address") + 1] if "--advertise-address" in args[:-1] else ""
        env = {e["name"]: e for e in c.get("env", [])}
        m = re.fullmatch(r"\$\((\w+)\):(\d+)", adv)
        if not m:
            bad(f"kgpu-extender: --leader-elect without --advertise-address $(POD_IP):PORT (got {adv!r})")
        elif env.get(m.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
            bad(f"kgpu-extender: --advertise-address uses ${m.group(1)}, which is not the pod's status.podIP")
        else:
            adv_port = int(m.group(2))
    for flag in flags:
        if flag not in args or args.index(flag) + 1 >= len(args):
            bad(f"kgpu-extender: no {flag}")
            continue
        name, k = mounted_secret(ext, args[args.index(flag) + 1])
        if name:
            check_key(secrets, name, k, f"kgpu-extender {flag}")
    for probe in ("readinessProbe", "livenessProbe"):
        if c.get(probe, {}).get("httpGet", {}).get("scheme") != "HTTPS":
            bad(f"kgpu-extender: {probe} is not HTTPS")
    port = None
    for p in c.get("ports", []):
        if svc["spec"]["ports"][0].get("targetPort") in (p.get("name"), p.get("containerPort")):
            port = p["containerPort"]
    if port is None:
        bad("Service kgpu-extender targets no port of the extender")
    elif adv_port is not None and adv_port != port:
        bad(f"kgpu-extender: --advertise-address port {adv_port} is not the container port {port}")
    ext_labels = ext["spec"]["template"]["metadata"]["labels"]
    sched_labels = sched["spec"]["template"]["metadata"]["labels"]
    if not selects(policy["spec"].get("podSelector", {}), ext_labels):
        bad("NetworkPolicy kgpu-extender does not select the extender's pods")
    if "Ingress" not in policy["spec"].get("policyTypes", []):
        bad("NetworkPolicy kgpu-extender does not restrict ingress")
    for rule in policy["spec"].get("ingress", []):
        froms = rule.get("from", [])
        if not froms:
            bad("NetworkPolicy kgpu-extender: a rule admits every source")
        for f in froms:
            if "podSelector" not in f or "namespaceSelector" in f or not (
                selects(f["podSelector"], sched_labels) or selects(f["podSelector"], ext_labels)
            ):
                bad(f"NetworkPolicy kgpu-extender: a source other than kgpu-scheduler and the extender's pods: {f}")
        if "--leader-elect" in args and not any("podSelector" in f and selects(f["podSelector"], ext_labels)
                                                for f in froms):
            bad("NetworkPolicy kgpu-extender: the replicas cannot reach each other (a standby's forwarded binds)")
        if [p.get("port") for p in rule.get("ports", [])] != [port]:
            bad(f"NetworkPolicy kgpu-extender: ports {rule.get('ports')} are not the extender's {port}")

    url = f"https://{svc['metadata']['name']}.{ns}.svc:{svc['spec']['ports'][0]['port']}"
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    tls = check_scheduler_config(cfg, "kgpu-scheduler-config", url)
    if tls:
        for field in ("certFile", "keyFile", "caFile"):
            if tls.get(field):
                name, k = mounted_secret(sched, tls[field])
                if name:
                    check_key(secrets, name, k, f"kgpu-scheduler tlsConfig.{field}")
    if sched["spec"]["template"]["spec"].get("hostNetwork"):
        bad("kgpu-scheduler runs on the host network, where the Service name does not resolve")

    static_cfg = yaml.safe_load(open(static, encoding="utf-8"))
    check_scheduler_config(static_cfg, "kube-scheduler-config.yaml", url, "/etc/kubernetes/kgpu-extender-client")
    if "default-scheduler" not in {p.get("schedulerName") for p in static_cfg.get("profiles", [])}:
        bad("kube-scheduler-config.yaml: the default-scheduler profile is gone")
    return finish(objs + secret_objs, out)


def finish(objects, out):
    with open(out, "w", encoding="utf-8") as f:
        json.dump(objects, f)
    for p in problems:
        print(f"check_extender: {p}")
    print(f"check_extender: {len(objects)} objects, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
