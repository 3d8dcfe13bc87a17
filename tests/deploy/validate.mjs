// Validates Kubernetes objects against the Kubernetes JSON schemas (npm kubernetes-models, and
// @kubernetes-models/prometheus-operator for monitoring.coreos.com).
//
//   node validate.mjs OBJECTS.json [LABEL]
//
// OBJECTS.json: a JSON array of objects (tests/deploy/kustomize_test.sh renders deploy/ with
// `kubectl kustomize` and converts the YAML). Every object must have a schema here: an apiVersion
// or kind without one is an error, not a skip. Exit 0 when every object is valid, else 1 with one
// line per problem.
import { readFileSync } from "node:fs";

const [file, label = file] = process.argv.slice(2);
if (!file) {
  console.error("usage: node validate.mjs OBJECTS.json [LABEL]");
  process.exit(2);
}

// apiVersion -> module that exports one class per kind.
function moduleFor(apiVersion) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}`;
  }
  return `kubernetes-models/${apiVersion}`;
}

const objects = JSON.parse(readFileSync(file, "utf8"));
let problems = 0;
for (const [i, obj] of objects.entries()) {
  const name = `${obj?.kind ?? "?"} ${obj?.metadata?.namespace ?? ""}/${obj?.metadata?.name ?? "?"}`;
  const where = `${label}: object ${i + 1} (${name})`;
  if (!obj || typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
    console.log(`${where}: no apiVersion/kind`);
    problems++;
    continue;
  }
  let mod;
  try {
    mod = await import(moduleFor(obj.apiVersion));
  } catch (e) {
    console.log(`${where}: no schema for apiVersion ${obj.apiVersion} (${e.code ?? e.message})`);
    problems++;
    continue;
  }
  const Kind = mod[obj.kind];
  if (typeof Kind !== "function") {
    console.log(`${where}: no schema for kind ${obj.kind} in ${obj.apiVersion}`);
    problems++;
    continue;
  }
  try {
    new Kind(obj).validate();
  } catch (e) {
    const details = (e.errors ?? []).map((x) => `${x.instancePath || "/"} ${x.message}` +
      (x.params?.additionalProperty ? ` (${x.params.additionalProperty})` : "")).join("; ");
    console.log(`${where}: ${details || e.message}`);
    problems++;
  }
}
console.log(`${label}: ${objects.length} objects validated, ${problems} invalid`);
process.exit(problems === 0 ? 0 : 1);
