// ctest k8s_manifest_schema: every document of deploy/kubernetes/*.yaml validated offline against
// the Kubernetes API's JSON schema (npm kubernetes-models, installed by the README's set-up line),
// then checked for what an eBPF agent on GPU nodes needs (docs/deploy.md "Kubernetes").
// Usage: node check_manifests.mjs <repo root>; exit 77 (skipped) when the npm modules are absent.
import fs from "node:fs";
import path from "node:path";
import { execSync } from "node:child_process";

const root = process.argv[2];
let modules = process.env.NODE_PATH || "";
if (!modules) {
  try {
    modules = execSync("npm root -g", { encoding: "utf8" }).trim();
  } catch {
    modules = "/usr/lib/node_modules";
  }
}
const need = ["kubernetes-models", "yaml"].filter((m) => !fs.existsSync(path.join(modules, m)));
if (need.length) {
  console.log(`SKIP: npm modules missing in ${modules}: ${need.join(", ")} (npm install -g kubernetes-models@5.1.0 yaml@2.6.1)`);
  process.exit(77);
}
const YAML = (await import(path.join(modules, "yaml/dist/index.js"))).default;
const kinds = {
  "v1/Namespace": "v1/Namespace.js",
  "v1/ServiceAccount": "v1/ServiceAccount.js",
  "v1/Secret": "v1/Secret.js",
  "v1/Service": "v1/Service.js",
  "apps/v1/DaemonSet": "apps/v1/DaemonSet.js",
};
let failures = 0;
const fail = (m) => {
  console.log("FAIL: " + m);
  failures++;
};
const dir = path.join(root, "deploy/kubernetes");
let daemonsets = 0;
for (const file of fs.readdirSync(dir).filter((f) => f.endsWith(".yaml"))) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(path.join(dir, file), "utf8"));
  for (const doc of docs) {
    if (doc.errors.length) {
      fail(`${file}: YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJSON();
    if (!obj) continue;
    const key = `${obj.apiVersion}/${obj.kind}`;
    const mod = kinds[key];
    if (!mod) {
      fail(`${file}: ${key} has no schema here (add it to tests/deploy/check_manifests.mjs)`);
      continue;
    }
    const cls = Object.values(await import(path.join(modules, "kubernetes-models", mod)))[0];
    try {
      new cls(obj).validate();
      console.log(`${file}: ${key} ${obj.metadata.name}: valid`);
    } catch (e) {
      fail(`${file}: ${key} ${obj.metadata?.name}: ${e.message}`);
      continue;
    }
    if (obj.kind !== "DaemonSet") continue;
    daemonsets++;
    const spec = obj.spec.template.spec;
    const c = spec.containers[0];
    const mounts = new Set((c.volumeMounts || []).map((m) => m.mountPath));
    if (!spec.hostPID) fail("DaemonSet: hostPID must be true (the host's processes)");
    for (const m of ["/sys/kernel/btf", "/sys/kernel/tracing", "/sys/fs/bpf"])
      if (!mounts.has(m)) fail(`DaemonSet: no mount of ${m}`);
    if (!spec.nodeSelector || !Object.keys(spec.nodeSelector).some((k) => k.includes("gpu")))
      fail("DaemonSet: no GPU node selector");
    if (!(spec.tolerations || []).some((t) => (t.key || "").includes("gpu"))) fail("DaemonSet: no GPU toleration");
    for (const k of ["requests", "limits"])
      if (!c.resources?.[k]?.cpu || !c.resources?.[k]?.memory) fail(`DaemonSet: resources.${k} needs cpu and memory`);
    const ann = obj.spec.template.metadata.annotations || {};
    const port = (c.ports || []).find((p) => p.name === "metrics");
    if (!port || ann["prometheus.io/scrape"] !== "true" || ann["prometheus.io/port"] !== String(port.containerPort))
      fail("DaemonSet: the metrics port is not announced for scraping (port named metrics + prometheus.io annotations)");
    const sc = c.securityContext || {};
    if (sc.privileged) fail("DaemonSet: privileged; add the capabilities instead");
    const add = sc.capabilities?.add || [];
    for (const cap of ["BPF", "PERFMON"]) if (!add.includes(cap)) fail(`DaemonSet: capability ${cap} missing`);
    if (add.includes("SYS_ADMIN")) fail("DaemonSet: SYS_ADMIN (only for kernels < 5.8)");
    if (!(c.args || []).some((a) => a.startsWith("--max-disk"))) fail("DaemonSet: no --max-disk bound");
  }
}
if (!daemonsets) fail("no DaemonSet found");
process.exit(failures ? 1 : 0);
