// lib.mjs - shared helpers of the deployment checks: a tiny check runner that prints one line
// per check and ends with "N passed, N failed", YAML loading, offline validation of Kubernetes
// objects against the OpenAPI schemas that the kubernetes-models packages compile, with a strict
// mode that also rejects unknown fields, and unit parsers (Kubernetes quantities, attnd sizes,
// nginx sizes, durations).
//
// Schemas: core Kubernetes kinds come from kubernetes-models (generated from the Kubernetes
// 1.34 OpenAPI document), ServiceMonitor from @kubernetes-models/prometheus-operator; KServe's
// kinds have no npm package, so minimal schemas live in ./schemas (see validate.mjs).

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, "..", "..");

// ---- check runner ------------------------------------------------------------------------

const tally = { passed: 0, failed: 0, skipped: 0 };

/* Thrown by a check that cannot run here; it is counted as skipped, with the reason printed. */
export class Skip extends Error {}

/* Runs one named check. `fn` may be async; it fails by throwing (the message is printed) and
 * may return a short note to print after "ok". */
export async function check(name, fn) {
    try {
        const note = await fn();
        tally.passed++;
        console.log(`ok ${name}${note ? ` (${note})` : ""}`);
    } catch (e) {
        if (e instanceof Skip) {
            tally.skipped++;
            console.log(`skip ${name}: ${e.message}`);
        } else {
            tally.failed++;
            console.log(`FAIL ${name}: ${e && e.message ? e.message : e}`);
        }
    }
}

/* Prints the closing line and sets the exit status. */
export function finish() {
    const skipped = tally.skipped ? `, ${tally.skipped} skipped` : "";
    console.log(`${tally.passed} passed, ${tally.failed} failed${skipped}`);
    process.exitCode = tally.failed ? 1 : 0;
}

export function assert(cond, message) {
    if (!cond) throw new Error(message);
}

export function rel(file) {
    return path.relative(ROOT, file);
}

// ---- YAML ----------------------------------------------------------------------------------

/* Parses every document of a YAML text; throws on any syntax error or duplicate key. Empty
 * documents (a trailing "---") are dropped. `merge` enables "<<" merge keys (Compose files). */
export function parseYamlAll(text, where, { merge = false } = {}) {
    const docs = YAML.parseAllDocuments(text, { merge, prettyErrors: true, uniqueKeys: true });
    const out = [];
    for (const doc of docs) {
        const problems = [...doc.errors, ...doc.warnings];
        if (problems.length)
            throw new Error(`${where}: ${problems.map((p) => p.message).join("; ")}`);
        const value = doc.toJS({ maxAliasCount: 100 });
        if (value !== null && value !== undefined) out.push(value);
    }
    return out;
}

export function loadYamlFile(file, opts) {
    return parseYamlAll(fs.readFileSync(file, "utf8"), rel(file), opts);
}

// ---- strict schema validation --------------------------------------------------------------
//
// The compiled validators of kubernetes-models check types, enums, formats and required
// fields, but like the API server's OpenAPI schemas they accept unknown fields, and a typo such
// as "readinesProbe" would then pass silently (the API server's strict field validation or
// kubeconform -strict would reject it). To get the same strictness offline, the object is
// validated through proxies that record which keys the validator reads: a compiled validator
// reads every property its schema declares (present or not), and enumerates the keys of maps
// (labels, resources, additionalProperties). After a successful validation, a key that the
// validator neither read nor enumerated is unknown to the schema. An object none of whose keys
// were read is free-form in the schema (x-kubernetes-preserve-unknown-fields) and is skipped.

function tracked(value, where, records) {
    if (Array.isArray(value)) return value.map((v, i) => tracked(v, `${where}/${i}`, records));
    if (value === null || typeof value !== "object") return value;
    const rec = { where, keys: Object.keys(value), read: new Set(), enumerated: false };
    records.push(rec);
    const copy = {};
    for (const k of rec.keys) copy[k] = tracked(value[k], `${where}/${k}`, records);
    return new Proxy(copy, {
        get(target, key, receiver) {
            if (typeof key === "string") rec.read.add(key);
            return Reflect.get(target, key, receiver);
        },
        has(target, key) {
            if (typeof key === "string") rec.read.add(key);
            return Reflect.has(target, key);
        },
        ownKeys(target) {
            rec.enumerated = true;
            return Reflect.ownKeys(target);
        },
    });
}

/* Runs `validateFn` (an ajv-style function: returns a boolean, sets .errors) on `value` and
 * throws a readable error for schema violations, then for unknown fields. `delegated` lists
 * object paths ("/spec/predictor/model") whose other fields another validator checks. */
export function validateStrict(validateFn, value, where, delegated = []) {
    const records = [];
    const proxy = tracked(value, "", records);
    if (!validateFn(proxy)) {
        const errs = (validateFn.errors || [])
            .slice(0, 6)
            .map((e) => {
                const p = e.params || {};
                const extra = p.allowedValues ? ` ${JSON.stringify(p.allowedValues)}` : p.additionalProperty ? ` (${p.additionalProperty})` : "";
                return `${e.instancePath || "/"} ${e.message}${extra}`;
            });
        throw new Error(`${where}: ${errs.join("; ")}`);
    }
    const unknown = [];
    for (const rec of records) {
        if (rec.enumerated || rec.read.size === 0 || delegated.includes(rec.where)) continue;
        for (const k of rec.keys) if (!rec.read.has(k)) unknown.push(`${rec.where}/${k}`);
    }
    if (unknown.length) throw new Error(`${where}: unknown field(s) ${unknown.join(", ")}`);
}

/* The validator of a Kubernetes kind from kubernetes-models / prometheus-operator, or null. */
export async function kindValidator(apiVersion, kind) {
    let spec;
    const slash = apiVersion.indexOf("/");
    const group = slash < 0 ? "" : apiVersion.slice(0, slash);
    const version = slash < 0 ? apiVersion : apiVersion.slice(slash + 1);
    if (group === "monitoring.coreos.com")
        spec = `@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}/${kind}`;
    else if (group === "") spec = `kubernetes-models/v1/${kind}`;
    else spec = `kubernetes-models/${group}/${version}/${kind}`;
    let mod;
    try {
        mod = await import(spec);
    } catch {
        return null;
    }
    const cls = mod[kind];
    if (!cls || !cls.prototype || typeof cls.prototype.validate !== "function") return null;
    // Model.prototype.validate runs the compiled validator on `this` and throws a
    // ValidationError carrying ajv's errors; adapt it to the ajv calling convention.
    const fn = (data) => {
        try {
            cls.prototype.validate.call(data);
            fn.errors = null;
            return true;
        } catch (e) {
            fn.errors = e.errors || [{ instancePath: "", message: e.message }];
            return false;
        }
    };
    return fn;
}

/* The validator of an embedded core type, e.g. coreValidator("Container"). */
export async function coreValidator(kind) {
    return kindValidator("v1", kind);
}

// ---- units ---------------------------------------------------------------------------------

const BIN = { "": 1, K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 };

/* attnd's size syntax (server/config.c): digits, then an optional K/M/G/T (binary), an
 * optional "i"/"I" after it, and an optional "B". */
export function attndSize(text) {
    const m = /^(\d+)(?:([KMGTkmgt])[iI]?)?[bB]?$/.exec(String(text));
    if (!m) throw new Error(`"${text}" is not an attnd size`);
    return Number(m[1]) * BIN[(m[2] || "").toUpperCase()];
}

/* A Kubernetes resource quantity ("6Gi", "500m", "4", "1e3", "2G") as a number. */
export function quantity(text) {
    const m = /^([0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/.exec(String(text));
    if (!m) throw new Error(`"${text}" is not a Kubernetes quantity`);
    const mult = {
        undefined: 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
        Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
    }[m[2]];
    return Number(m[1]) * mult;
}

/* nginx's size syntax: a number with an optional k/m/g (binary) suffix. */
export function nginxSize(text) {
    const m = /^(\d+)([kKmMgG]?)$/.exec(String(text));
    if (!m) throw new Error(`"${text}" is not an nginx size`);
    return Number(m[1]) * BIN[m[2].toUpperCase()];
}

/* A Go/nginx/Compose duration ("40s", "1m30s", "500ms", "2h") in seconds. */
export function durationSeconds(text) {
    const s = String(text);
    const re = /(\d+(?:\.\d+)?)(ms|us|ns|h|m|s|d)/gy;
    let total = 0;
    let pos = 0;
    let m;
    while ((m = re.exec(s))) {
        const unit = { ns: 1e-9, us: 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600, d: 86400 }[m[2]];
        total += Number(m[1]) * unit;
        pos = re.lastIndex;
    }
    if (pos === 0 || pos !== s.length) {
        if (/^\d+$/.test(s)) return Number(s); // nginx: a bare number is seconds
        throw new Error(`"${text}" is not a duration`);
    }
    return total;
}
