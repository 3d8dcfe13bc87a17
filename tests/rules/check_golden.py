#!/usr/bin/env python3
"""The alert rules, the Grafana dashboard and the promtool tests against what `kgpu exporter`
really serves: the golden scrapes in tests/rules/golden/*.prom (tests/rules/capture_golden.sh).
tests/rules/run.sh (ctest rules.alerts) runs checks 1-4; ctest rules.golden runs them with --bin
(check 5), against the binary just built.

usage: check_golden.py REPO_ROOT [--bin DIR --simnvml DIR]

Checks, each problem one line on stderr (exit 1):
 1. names and labels: every metric name in the alert rules (expressions and the queries in their
    annotations), in every dashboard query and template variable, is a family of the golden
    scrapes; every label a selector matches on is a label of that family; every label a rule or a
    query groups or joins by, every {{label}} of a legend and every $labels.X of an annotation is a
    label of a family the expression reads (or a grouping label of it).
 2. the promtool tests' input series (tests/rules/*.test.yaml) have exactly the label names of a
    series in the golden scrapes, plus Prometheus' target labels `instance` and `job`.
 3. every dashboard query returns data on the golden scrapes (promtool test rules, with the
    golden series as input and tests/rules/dashboard.rules.yaml as rules).
 4. `promtool check metrics` finds nothing in the golden scrapes but the findings dcgm-exporter's
    names cause (EXEMPT below); every family has HELP and TYPE.
 5. with --bin (the built kgpu and kgpu-simctl) and --simnvml (the simulated libnvidia-ml.so.1):
    capture_golden.sh runs again into a temporary directory, and its families, types and label
    names must equal the committed files' (values vary and are not compared), else the golden
    files are stale: re-run tests/rules/capture_golden.sh. Checks 1-4 then run on the fresh
    capture too, so the rules and the dashboard are held to the binary that was just built.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

problems = []


def problem(msg):
    problems.append(msg)


# ---------------------------------------------------------------- exposition format
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_labels(text, where):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        if not m:
            problem(f"{where}: cannot parse labels at {text[pos:]!r}")
            break
        labels[m.group(1)] = m.group(2)
        pos = m.end()
    return labels


def parse_page(path):
    """family -> {"type", "help", "labelsets": {frozenset of label names}, "samples": [(labels, value)]}.
    A label with an empty value is no label (Prometheus drops it at the scrape)."""
    fams = {}

    def fam(name):
        return fams.setdefault(name, {"type": None, "help": None, "labelsets": set(), "samples": []})

    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                parts = line.split(" ", 3)
                key = "help" if parts[1] == "HELP" else "type"
                fam(parts[2])[key] = parts[3] if len(parts) > 3 else ""
                continue
            if line.startswith("#"):
                continue
            m = SAMPLE.match(line)
            if not m:
                problem(f"{path}:{n}: not a sample line: {line!r}")
                continue
            name = m.group(1)
            labels = {k: v for k, v in parse_labels(m.group(3) or "", f"{path}:{n}").items() if v != ""}
            for suffix in ("_bucket", "_sum", "_count"):  # histogram/summary series belong to their family
                if name.endswith(suffix) and name[: -len(suffix)] in fams and name not in fams:
                    name = name[: -len(suffix)]
            entry = fam(name)
            entry["labelsets"].add(frozenset(labels))
            entry["samples"].append((labels, m.group(4)))
    return fams


def merge_pages(pages):
    out = {}
    for fams in pages:
        for name, f in fams.items():
            e = out.setdefault(name, {"type": f["type"], "help": f["help"], "labelsets": set(), "samples": []})
            e["labelsets"] |= f["labelsets"]
            e["samples"] += f["samples"]
    return out


def labels_of(fams, name):
    out = set()
    for ls in fams.get(name, {}).get("labelsets", ()):
        out |= ls
    return out


# ---------------------------------------------------------------- PromQL, enough to find names and labels
TOKEN = re.compile(r"""
   (?P<ws>\s+)
 | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
 | (?P<num>0x[0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?)
 | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
 | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@])
""", re.X)
AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
               "topk", "quantile"}
FUNCTIONS = AGGREGATORS | {
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "day_of_month",
    "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile",
    "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10",
    "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt",
    "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
    "count_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
    "present_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan",
    "tanh", "deg", "rad", "pi"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2"}


def tokenize(expr):
    toks, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 30]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            toks.append((m.lastgroup, m.group()))
    return toks


def unquote(s):
    return s[1:-1].replace('\\"', '"').replace("\\\\", "\\")


class Uses:
    """What an expression reads: selectors [((metric, ...), [label names matched])] (several
    metrics for {__name__=~"a|b"}) and grouping labels."""

    def __init__(self):
        self.selectors = []
        self.grouping = set()
        self.dropping = set()
        self.functions = set()

    def metrics(self):
        return {m for names, _ in self.selectors for m in names}


def promql_uses(expr, uses=None):
    uses = uses or Uses()
    toks = tokenize(expr)
    i = 0

    def matchers(i):  # toks[i] is "{": returns (names from __name__, labels, index after "}")
        names, labels = [], []
        i += 1
        while i < len(toks) and toks[i][1] != "}":
            if toks[i][0] == "ident" and i + 2 < len(toks) and toks[i + 1][1] in ("=", "!=", "=~", "!~"):
                label, op, value = toks[i][1], toks[i + 1][1], unquote(toks[i + 2][1])
                if label == "__name__":
                    if op == "=":
                        names.append(value)
                    elif op == "=~" and re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\|[a-zA-Z_:][a-zA-Z0-9_:]*)*", value):
                        names += value.split("|")
                    else:
                        raise ValueError(f"__name__{op}{value!r}: only = and a plain alternation are understood")
                else:
                    labels.append(label)
                i += 3
            else:
                i += 1
        return names, labels, i + 1

    while i < len(toks):
        kind, val = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "ident" and val in GROUPING and nxt == "(":
            # `without`/`ignoring` may name labels a series does not have (dcgm-exporter's
            # pod_uid and vgpu): dropping one that is absent is no mistake. `by`/`on` must name
            # labels that exist, or the result loses them.
            into = uses.dropping if val in ("without", "ignoring") else uses.grouping
            i += 2
            while i < len(toks) and toks[i][1] != ")":
                if toks[i][0] == "ident":
                    into.add(toks[i][1])
                i += 1
            i += 1
        elif kind == "ident" and val.lower() in KEYWORDS:
            i += 1
        elif kind == "ident" and val in FUNCTIONS:
            uses.functions.add(val)
            i += 1
        elif kind == "ident":
            if nxt == "(":
                raise ValueError(f"unknown function {val}()")
            if nxt == "{":
                _, labels, i = matchers(i + 1)
            else:
                labels, i = [], i + 1
            uses.selectors.append(((val,), labels))
        elif val == "{":
            names, labels, i = matchers(i)
            if not names:
                raise ValueError("a selector without a metric name")
            uses.selectors.append((tuple(names), labels))
        else:
            i += 1
    return uses


def output_labels(expr):
    """The labels an expression's result can carry, when its outermost operation says (an
    aggregation `by (...)`): None when not known this simply."""
    m = re.match(r"\s*(?:round\s*\(\s*)?(%s)\s+by\s*\(([^)]*)\)" % "|".join(AGGREGATORS), expr)
    if m:
        return {x.strip() for x in m.group(2).split(",") if x.strip()}
    return None


# Labels every scraped series has: Prometheus adds them to what the exporter serves.
TARGET_LABELS = {"instance", "job"}


def check_uses(where, uses, fams, context=None):
    """Every metric is a family; every matched label is one of its labels (one of the metrics' of
    {__name__=~"a|b"}); every grouping label is a label of a family the expression reads, or of
    `context` (the labels of the other queries of a table that merges them, which group by the
    same labels to line up their columns). Returns the labels of the families read."""
    read = set(TARGET_LABELS)
    for names, labels in uses.selectors:
        have = set(TARGET_LABELS)
        for metric in names:
            if metric not in fams:
                problem(f"{where}: {metric} is not in the golden scrapes (tests/rules/golden)")
            have |= labels_of(fams, metric)
        read |= have
        for label in labels:
            if label not in have:
                problem(f"{where}: {'|'.join(names)} has no label {label} in the golden scrapes "
                        f"(it has {', '.join(sorted(have))})")
    for label in sorted(uses.grouping):
        if label not in read and label not in (context or ()):
            problem(f"{where}: groups or matches by {label}, which none of {', '.join(sorted(uses.metrics()))} has")
    return read


# ---------------------------------------------------------------- the rules and the dashboard
GRAFANA_VARS = [("$__rate_interval", "2m"), ("$__interval", "1m"), ("$__range", "1h"),
                ("$Hostname", ".*"), ("$gpu", ".*"), ("$namespace", ".*"), ("$pod", ".*")]


def grafana_subst(expr):
    for var, value in GRAFANA_VARS:
        expr = expr.replace(var, value)
    return expr


def check_rules(root, fams):
    path = os.path.join(root, "deploy", "monitoring", "kgpu-alerts.rules.yaml")
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    n = 0
    for g in doc.get("groups", []):
        for r in g.get("rules", []):
            n += 1
            name = r.get("alert") or r.get("record")
            where = f"{os.path.relpath(path, root)}: {name}"
            try:
                uses = promql_uses(r["expr"])
            except ValueError as e:
                problem(f"{where}: {e}")
                continue
            read = check_uses(where, uses, fams)
            # The queries inside the annotations (`query (printf `...` args)`): %q is a quoted
            # value, %s the selector fragment $sel (label matchers, beginning with UUID=%q).
            ann = " ".join(str(v) for v in (r.get("annotations") or {}).values())
            frag_labels, sel_metrics = set(), set()
            for text in re.findall(r"printf\s*`([^`]*)`", ann):
                q = text.replace("%q", '"v"')
                if re.match(r"^(%s,)?[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)", q):
                    frag_labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)(?:=|!=|=~|!~)", q.replace("%s,", "")))
                    continue
                try:
                    tu = promql_uses(q.replace("%s", 'UUID="v"'))
                except ValueError as e:
                    problem(f"{where}: annotation query {text!r}: {e}")
                    continue
                check_uses(f"{where} (annotation query {text!r})", tu, fams)
                if "%s" in text:
                    sel_metrics |= tu.metrics()
            for label in sorted(frag_labels):
                if sel_metrics and not any(label in labels_of(fams, m) for m in sel_metrics):
                    problem(f"{where}: an annotation query selects {', '.join(sorted(sel_metrics))} by {label}, "
                            "which none of them has")
            own = set((r.get("labels") or {}).keys())
            for label in sorted(set(re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", ann))):
                if label not in read and label not in own:
                    problem(f"{where}: the annotations use $labels.{label}, which no series of the expression has")
    return n


def dashboard_panels(dash):
    out = []

    def walk(ps):
        for p in ps:
            out.append(p)
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    return out


def check_dashboard(root, fams):
    path = os.path.join(root, "deploy", "monitoring", "grafana-dashboard.json")
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    rel = os.path.relpath(path, root)
    n = 0
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("definition") or v.get("query", {}).get("query", "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", q)
        if not m:
            problem(f"{rel}: variable {v.get('name')}: not label_values(<selector>, <label>): {q!r}")
            continue
        n += 1
        where = f"{rel}: variable {v.get('name')}"
        try:
            uses = promql_uses(grafana_subst(m.group(1)))
        except ValueError as e:
            problem(f"{where}: {e}")
            continue
        uses.grouping.add(m.group(2))
        check_uses(where, uses, fams)
    for p in dashboard_panels(dash):
        targets = [t for t in p.get("targets", []) if t.get("expr")]
        panel_read = set()
        parsed = []
        for t in targets:
            try:
                uses = promql_uses(grafana_subst(t["expr"]))
            except ValueError as e:
                problem(f"{rel}: panel {p.get('id')} {p.get('title')!r} query {t.get('refId')}: {e}")
                continue
            parsed.append((t, uses))
            for names, _ in uses.selectors:
                for m in names:
                    panel_read |= labels_of(fams, m)
        merged = any(tr.get("id") == "merge" for tr in p.get("transformations", []))
        for t, uses in parsed:
            expr = t["expr"]
            n += 1
            where = f"{rel}: panel {p.get('id')} {p.get('title')!r} query {t.get('refId')}"
            read = check_uses(where, uses, fams, context=panel_read if merged else None)
            out = output_labels(grafana_subst(expr))
            for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", t.get("legendFormat", "")):
                if out is not None and label not in out:
                    problem(f"{where}: the legend uses {{{{{label}}}}}, which the query aggregates away")
                elif label not in read:
                    problem(f"{where}: the legend uses {{{{{label}}}}}, which no series it reads has")
    return n


# ---------------------------------------------------------------- the promtool tests' input series
def check_test_inputs(root, fams):
    n = 0
    for path in sorted(glob.glob(os.path.join(root, "tests", "rules", "*.test.yaml"))):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for t in doc.get("tests") or []:
            for s in t.get("input_series") or []:
                n += 1
                m = re.fullmatch(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*", s["series"])
                if not m:
                    problem(f"{rel}: {t.get('name')!r}: cannot read series {s['series']!r}")
                    continue
                name = m.group(1)
                labels = set(parse_labels(m.group(2) or "", rel))
                where = f"{rel}: test {t.get('name')!r}: {name}"
                if name not in fams:
                    problem(f"{where}: not a family of the golden scrapes")
                    continue
                if not TARGET_LABELS <= labels:
                    problem(f"{where}: no {' and '.join(sorted(TARGET_LABELS - labels))} (Prometheus adds them at the scrape)")
                own = frozenset(labels - TARGET_LABELS)
                if own not in fams[name]["labelsets"]:
                    best = min(fams[name]["labelsets"], key=lambda ls: len(ls ^ own))
                    problem(f"{where}: labels {sorted(own)} are no label set the exporter serves; the nearest golden one "
                            f"{'lacks ' + ', '.join(sorted(own - best)) if own - best else ''}"
                            f"{'; ' if own - best and best - own else ''}"
                            f"{'also has ' + ', '.join(sorted(best - own)) if best - own else ''}")
    return n


# ---------------------------------------------------------------- every dashboard query returns data
def check_dashboard_has_data(root, golden_files, tmp):
    rules = os.path.join(root, "tests", "rules", "dashboard.rules.yaml")
    with open(rules, encoding="utf-8") as f:
        records = [r["record"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    series = []
    for i, path in enumerate(golden_files):
        for name, fam in parse_page(path).items():
            for labels, value in fam["samples"]:
                if value in ("NaN", "+Inf", "-Inf"):
                    continue
                ls = dict(labels, instance=f"10.0.0.{i + 1}:9400", job="kgpu-exporter")
                body = ",".join(f'{k}="{v}"' for k, v in ls.items())
                series.append({"series": f"{name}{{{body}}}", "values": f"{value}x90"})
    test = {
        "rule_files": [os.path.abspath(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "every dashboard query returns data on the golden scrapes",
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{"expr": f"group({r})", "eval_time": "70m", "exp_samples": [{"labels": "{}", "value": 1}]}
                                 for r in records],
        }],
    }
    path = os.path.join(tmp, "dashboard-on-golden.test.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(test, f, sort_keys=False)
    r = subprocess.run(["promtool", "test", "rules", path], capture_output=True, text=True)
    if r.returncode != 0:
        problem("a dashboard query returns no data on the golden scrapes (promtool test rules):\n" + r.stdout + r.stderr)
    return len(records)


# ---------------------------------------------------------------- promtool check metrics
# The findings that dcgm-exporter's own names cause, exempt because kgpu keeps those names so
# that its dashboards and alerts work unchanged (docs/exporter.md). Nothing else is exempt; in
# particular never `no help text`.
#  - label names: modelName (dcgm-exporter's GPU label) is not snake_case. Every GPU family
#    carries it: the DCGM_* families, and kgpu's per-GPU families (kgpu_gpu_up,
#    kgpu_gpu_unhealthy_reason, kgpu_pod_gpu_memory_limit_bytes), which share the GPU labels so
#    that alerts and the dashboard can join on them.
#  - dcgm-exporter's counters are named without a lowercase _total suffix (the check is
#    case-sensitive: ..._TOTAL does not count);
#  - DCGM_FI_DEV_PCIE_REPLAY_COUNTER names its type.
EXEMPT = [
    re.compile(r"^DCGM_[A-Z0-9_]+ label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r'^DCGM_[A-Z0-9_]+ counter metrics should have "_total" suffix$'),
    re.compile(r"^DCGM_[A-Z0-9_]+_COUNTER metric name should not include type 'counter'$"),
    re.compile(r"^kgpu_(gpu_up|gpu_unhealthy_reason|pod_gpu_memory_limit_bytes) label names should be written in "
               r"'snake_case' not 'camelCase'$"),
]


def lint_page(path, rel):
    with open(path, "rb") as f:
        r = subprocess.run(["promtool", "check", "metrics"], stdin=f, capture_output=True, text=True)
    if r.returncode not in (0, 3):
        problem(f"{rel}: promtool check metrics exited {r.returncode} (not a valid page): {r.stdout}{r.stderr}")
        return
    for line in sorted(set((r.stdout + r.stderr).splitlines())):
        if line.strip() and not any(p.match(line) for p in EXEMPT):
            problem(f"{rel}: promtool check metrics: {line}")
    for name, fam in parse_page(path).items():
        if not fam["help"]:
            problem(f"{rel}: {name} has no HELP")
        if not fam["type"]:
            problem(f"{rel}: {name} has no TYPE")


# ---------------------------------------------------------------- stale golden files
def shape(fams):
    return {name: (f["type"], frozenset(f["labelsets"])) for name, f in fams.items()}


def compare(golden, fresh, rel):
    g, f = shape(parse_page(golden)), shape(parse_page(fresh))
    stale = []
    for name in sorted(set(g) | set(f)):
        if name not in g:
            stale.append(f"the exporter now serves {name}")
        elif name not in f:
            stale.append(f"the exporter no longer serves {name}")
        else:
            if g[name][0] != f[name][0]:
                stale.append(f"{name} is now of TYPE {f[name][0]} (golden: {g[name][0]})")
            for ls in sorted(f[name][1] - g[name][1], key=sorted):
                stale.append(f"{name} now has a series with labels {sorted(ls)}")
            for ls in sorted(g[name][1] - f[name][1], key=sorted):
                stale.append(f"{name} no longer has a series with labels {sorted(ls)}")
    for s in stale:
        problem(f"{rel} is stale: {s}")
    return not stale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--bin", help="directory of the built kgpu and kgpu-simctl: re-capture and compare")
    ap.add_argument("--simnvml", help="directory of the simulated libnvidia-ml.so.1 (with --bin)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    golden_dir = os.path.join(root, "tests", "rules", "golden")
    golden = sorted(glob.glob(os.path.join(golden_dir, "*.prom")))
    if not golden:
        print(f"check_golden: no golden scrapes in {golden_dir}: run tests/rules/capture_golden.sh", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="kgpu-golden-check.") as tmp:
        sets = [("golden", golden)]
        if args.bin:
            fresh_dir = os.path.join(tmp, "fresh")
            cmd = [os.path.join(root, "tests", "rules", "capture_golden.sh"), args.bin, args.simnvml or "", fresh_dir]
            if not args.simnvml:
                cmd[2] = os.path.join(args.bin, "..", "simnvml", "lib")
            print("check_golden: " + " ".join(cmd), flush=True)
            r = subprocess.run(cmd)
            if r.returncode != 0:
                print("check_golden: capture_golden.sh failed", file=sys.stderr)
                return 1
            fresh = sorted(glob.glob(os.path.join(fresh_dir, "*.prom")))
            names = {os.path.basename(p) for p in fresh}
            for p in golden:
                if os.path.basename(p) not in names:
                    problem(f"{os.path.relpath(p, root)}: capture_golden.sh no longer writes it")
            for p in fresh:
                g = os.path.join(golden_dir, os.path.basename(p))
                rel = os.path.relpath(g, root)
                if not os.path.exists(g):
                    problem(f"{rel} is missing: run tests/rules/capture_golden.sh")
                elif compare(g, p, rel):
                    print(f"check_golden: {rel}: families, types and label names as the binary serves them")
            sets.append(("fresh capture", fresh))

        for what, files in sets:
            fams = merge_pages([parse_page(p) for p in files])
            n_rules = check_rules(root, fams)
            n_dash = check_dashboard(root, fams)
            n_inputs = check_test_inputs(root, fams)
            n_data = check_dashboard_has_data(root, files, tmp)
            for p in files:
                lint_page(p, os.path.relpath(p, root) if p.startswith(root) else f"{what} {os.path.basename(p)}")
            print(f"check_golden: {what} ({len(fams)} families): {n_rules} rules, {n_dash} dashboard queries, "
                  f"{n_inputs} test input series, {n_data} dashboard queries with data, {len(files)} pages linted")

    for p in dict.fromkeys(problems):
        print(f"check_golden: {p}", file=sys.stderr)
    if problems:
        if any(" is stale: " in p for p in problems):
            print("check_golden: re-run tests/rules/capture_golden.sh and commit tests/rules/golden", file=sys.stderr)
        return 1
    print("check_golden: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
