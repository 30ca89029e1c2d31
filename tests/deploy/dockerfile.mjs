// dockerfile.mjs - a small Dockerfile reader for the deploy checks: logical instructions
// (continuation lines joined, comments dropped), build stages, exec-form arguments, and the
// packages each `apt-get install` names. Enough for the project's own Dockerfile; syntax
// errors are left to dockerfile-utils' validator, which image.mjs runs as well.

import fs from "node:fs";

/* Instructions of a Dockerfile as {keyword, rest, line}, keyword upper-cased, `rest` the
 * argument text with continuations joined by a space. Parser directives and comments are
 * dropped; heredocs are not supported (and not used). */
export function parseDockerfile(text) {
    const lines = text.split("\n");
    const out = [];
    let cur = null;
    for (let i = 0; i < lines.length; i++) {
        const raw = lines[i];
        const trimmed = raw.trim();
        if (cur === null) {
            if (trimmed === "" || trimmed.startsWith("#")) continue;
            const m = /^([A-Za-z]+)\s*(.*)$/.exec(trimmed);
            if (!m) throw new Error(`Dockerfile line ${i + 1}: cannot read "${trimmed}"`);
            cur = { keyword: m[1].toUpperCase(), rest: "", line: i + 1 };
            appendPart(cur, m[2]);
        } else if (trimmed.startsWith("#")) {
            continue; // a comment inside a continued instruction
        } else {
            appendPart(cur, trimmed);
        }
        if (!cur.continues) {
            delete cur.continues;
            out.push(cur);
            cur = null;
        }
    }
    if (cur) throw new Error(`Dockerfile ends inside a continued ${cur.keyword} instruction`);
    return out;
}

function appendPart(cur, part) {
    let p = part;
    cur.continues = p.endsWith("\\");
    if (cur.continues) p = p.slice(0, -1).trimEnd();
    cur.rest = cur.rest ? (p ? `${cur.rest} ${p}` : cur.rest) : p;
}

export function readDockerfile(file) {
    return parseDockerfile(fs.readFileSync(file, "utf8"));
}

/* Splits instructions into stages: [{from: "image:tag", name, instrs}]. */
export function stages(instrs) {
    const out = [];
    for (const ins of instrs) {
        if (ins.keyword === "FROM") {
            const words = ins.rest.split(/\s+/).filter((w) => !w.startsWith("--"));
            const as = words.findIndex((w) => w.toUpperCase() === "AS");
            out.push({ from: words[0], name: as >= 0 ? words[as + 1] : null, instrs: [], line: ins.line });
        } else if (out.length) {
            out[out.length - 1].instrs.push(ins);
        } else if (ins.keyword !== "ARG") {
            throw new Error(`Dockerfile line ${ins.line}: ${ins.keyword} before the first FROM`);
        }
    }
    return out;
}

/* Leading --name=value flags of an instruction (HEALTHCHECK, COPY...) and what follows. */
export function splitFlags(rest) {
    const flags = {};
    let s = rest;
    for (;;) {
        const m = /^--([a-z-]+)(?:=(\S*))?\s*/.exec(s);
        if (!m) break;
        flags[m[1]] = m[2] === undefined ? true : m[2];
        s = s.slice(m[0].length);
    }
    return { flags, rest: s };
}

/* The JSON array of an exec-form instruction, or null for the shell form. */
export function execForm(rest) {
    const t = rest.trim();
    if (!t.startsWith("[")) return null;
    const v = JSON.parse(t);
    if (!Array.isArray(v) || v.some((x) => typeof x !== "string"))
        throw new Error(`"${t}" is not a JSON array of strings`);
    return v;
}

/* Packages named by the `apt-get install` commands of a RUN's shell text. */
export function aptInstallPackages(shell) {
    const pkgs = [];
    for (const cmd of shell.split(/&&|;|\|\|/)) {
        const words = cmd.trim().split(/\s+/);
        const apt = words.findIndex((w) => w === "apt-get" || w === "apt");
        if (apt < 0 || words[apt + 1] !== "install") continue;
        for (const w of words.slice(apt + 2)) if (!w.startsWith("-")) pkgs.push(w);
    }
    return pkgs;
}

/* ENV assignments of an instruction, as [name, value] (both the "k=v k2=v2" and "k v" forms). */
export function envPairs(rest) {
    const pairs = [];
    if (!/^[A-Za-z_][A-Za-z0-9_]*=/.test(rest)) {
        const m = /^(\S+)\s+(.*)$/.exec(rest);
        if (m) pairs.push([m[1], m[2]]);
        return pairs;
    }
    const re = /([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|\S*)/g;
    let m;
    while ((m = re.exec(rest))) pairs.push([m[1], m[2].replace(/^"(.*)"$/, "$1")]);
    return pairs;
}
