// image.mjs - the Dockerfile side of tests/deploy/check_image.sh, which cannot build the image
// (no Docker engine runs here) and so proves it piece by piece.
//
//   node tests/deploy/image.mjs lint              lint checks, one "ok"/"FAIL" line each
//   node tests/deploy/image.mjs runtime-packages  packages the runtime stage installs
//   node tests/deploy/image.mjs usage             attnd flags and ATTND_* variables that the
//                                                 Dockerfile and deploy/ use ("flag NAME",
//                                                 "env NAME", one a line, with the file)
//   node tests/deploy/image.mjs build-context     "copy PATH" for each source the build stage
//                                                 COPYs from the context
//   node tests/deploy/image.mjs configs           each attnd configuration deploy/ defines:
//                                                 name, ATTND_*=value and --flag=value words,
//                                                 tab-separated, one a line
//
// `lint` runs dockerfile-utils' validator (the Dockerfile language server's checks: unknown
// instructions, bad flags, malformed JSON forms...) and then the project's structural rules,
// which stand in for hadolint (in neither Debian's apt nor the npm registry).

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { ROOT, check, finish, assert, rel, loadYamlFile } from "./lib.mjs";
import {
    readDockerfile, stages, splitFlags, execForm, aptInstallPackages, envPairs,
} from "./dockerfile.mjs";

const require = createRequire(import.meta.url);
// ATTND_DOCKERFILE lets check_image.sh lint deliberately broken copies (the lint must fail).
const DOCKERFILE = process.env.ATTND_DOCKERFILE || path.join(ROOT, "Dockerfile");
const DOCKERIGNORE = path.join(ROOT, ".dockerignore");

const BUILD_TOOLS = /^(build-essential|gcc|g\+\+|make|pkg-config|cmake|clang|.*-dev)$/;

function finalStage() {
    const st = stages(readDockerfile(DOCKERFILE));
    return { all: st, final: st[st.length - 1] };
}

// ---- lint ----------------------------------------------------------------------------------

/* Docker's .dockerignore rules, enough for plain patterns: the last matching line wins, "!"
 * re-includes, a pattern matching a folder matches everything under it. */
function dockerignored(patterns, file) {
    let ignored = false;
    for (const raw of patterns) {
        const neg = raw.startsWith("!");
        const pat = (neg ? raw.slice(1) : raw).replace(/^\/+|\/+$/g, "");
        const re = new RegExp(
            `^${pat
                .split("/")
                .map((seg) =>
                    seg === "**"
                        ? ".*"
                        : seg.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, "[^/]*").replace(/\?/g, "[^/]"),
                )
                .join("/")
                .replace(/\.\*\//g, "(?:.*/)?")}(?:/.*)?$`,
        );
        if (re.test(file)) ignored = !neg;
    }
    return ignored;
}

async function lint() {
    const text = fs.readFileSync(DOCKERFILE, "utf8");
    const instrs = readDockerfile(DOCKERFILE);
    const { all, final } = finalStage();
    const finalOf = (kw) => final.instrs.filter((i) => i.keyword === kw);

    await check("Dockerfile: dockerfile-utils validator reports no problem", () => {
        const { validate } = require("dockerfile-utils");
        const diags = validate(text, {});
        assert(
            diags.length === 0,
            diags.map((d) => `line ${d.range.start.line + 1}: ${d.message}`).join("; "),
        );
    });

    await check("Dockerfile: every FROM pins a tag or digest (no latest)", () => {
        const names = new Set(all.map((s) => s.name).filter(Boolean));
        for (const s of all) {
            if (names.has(s.from)) continue; // FROM an earlier stage
            const m = /^([^@:]+(?::\d+)?(?:\/[^@:]+)*)(?::([^@]+))?(?:@(sha256:[0-9a-f]{64}))?$/.exec(s.from);
            assert(m, `line ${s.line}: cannot read the image "${s.from}"`);
            assert(m[2] || m[3], `line ${s.line}: "${s.from}" has no tag or digest`);
            assert(m[2] !== "latest", `line ${s.line}: "${s.from}" uses latest`);
            // A bare release name (bookworm, 12) moves; a dated tag or a digest does not.
            assert(m[3] || /\d{8}|\d+\.\d+/.test(m[2]), `line ${s.line}: "${s.from}" is a moving tag; use a dated tag or a digest`);
        }
        return all.map((s) => s.from).join(", ");
    });

    await check("Dockerfile: multi-stage, the runtime copies only the binary from the builder", () => {
        assert(all.length >= 2, "only one stage");
        const builder = all[0];
        assert(builder.name, "the build stage has no name (FROM ... AS build)");
        assert(/-slim$/.test(final.from), `the runtime stage is not a -slim image: ${final.from}`);
        const copies = finalOf("COPY").map((c) => splitFlags(c.rest));
        assert(copies.length >= 1, "the runtime stage copies nothing");
        for (const c of copies)
            assert(c.flags.from === builder.name, `runtime COPY not from the build stage: ${c.rest}`);
        const runtimePkgs = final.instrs.filter((i) => i.keyword === "RUN").flatMap((i) => aptInstallPackages(i.rest));
        const tools = runtimePkgs.filter((p) => BUILD_TOOLS.test(p));
        assert(tools.length === 0, `the runtime stage installs build packages: ${tools.join(" ")}`);
    });

    await check("Dockerfile: the builder runs make for build/attnd", () => {
        const runs = all[0].instrs.filter((i) => i.keyword === "RUN").map((i) => i.rest);
        assert(runs.some((r) => /\bmake\b[^&;]*\bbuild\/attnd\b/.test(r)), "no `make ... build/attnd`");
        const pkgs = all[0].instrs.filter((i) => i.keyword === "RUN").flatMap((i) => aptInstallPackages(i.rest));
        for (const p of ["build-essential", "pkg-config", "libmicrohttpd-dev", "libgnutls28-dev", "libjansson-dev", "libopenblas-dev", "zlib1g-dev"])
            assert(pkgs.includes(p), `the builder does not install ${p}`);
    });

    await check("Dockerfile: apt-get installs use -y --no-install-recommends and clean the lists", () => {
        let n = 0;
        for (const ins of instrs.filter((i) => i.keyword === "RUN")) {
            for (const cmd of ins.rest.split(/&&|;/)) {
                if (!/\bapt-get\s+(?:\S+\s+)*install\b/.test(cmd) && !/\bapt-get install\b/.test(cmd)) continue;
                n++;
                assert(/--no-install-recommends/.test(cmd), `line ${ins.line}: apt-get install without --no-install-recommends`);
                assert(/(^|\s)(-y|--yes|-qy|-yq)(\s|$)/.test(cmd), `line ${ins.line}: apt-get install without -y`);
                assert(/\bapt-get update\b/.test(ins.rest), `line ${ins.line}: apt-get install without apt-get update in the same RUN`);
                assert(/rm -rf \/var\/lib\/apt\/lists\/\*/.test(ins.rest), `line ${ins.line}: the RUN does not rm -rf /var/lib/apt/lists/*`);
            }
            assert(!/\bapt-get\s+(dist-)?upgrade\b/.test(ins.rest), `line ${ins.line}: apt-get upgrade in an image build`);
        }
        assert(n >= 2, `expected an apt-get install in each stage, found ${n}`);
    });

    await check("Dockerfile: no ADD (no remote URLs, no implicit unpacking)", () => {
        const adds = instrs.filter((i) => i.keyword === "ADD");
        assert(adds.length === 0, adds.map((a) => `line ${a.line}: ADD ${a.rest}`).join("; "));
    });

    await check("Dockerfile: the runtime runs as a fixed non-root numeric user", () => {
        const users = finalOf("USER");
        assert(users.length >= 1, "the runtime stage has no USER");
        const u = users[users.length - 1].rest.trim();
        const m = /^(\d+)(?::(\d+))?$/.exec(u);
        assert(m, `USER ${u} is not numeric (runAsNonRoot needs a numeric UID)`);
        assert(Number(m[1]) !== 0, "USER is root");
        const created = final.instrs.some((i) => i.keyword === "RUN" && new RegExp(`useradd\\b.*--uid ${m[1]}\\b`).test(i.rest));
        assert(created, `no useradd --uid ${m[1]} in the runtime stage`);
        const after = final.instrs.slice(final.instrs.indexOf(users[users.length - 1]) + 1);
        assert(!after.some((i) => i.keyword === "USER"), "USER changes again later");
        return `UID ${m[1]}`;
    });

    await check("Dockerfile: ENV OPENBLAS_NUM_THREADS=1 in the runtime stage", () => {
        const env = Object.fromEntries(finalOf("ENV").flatMap((i) => envPairs(i.rest)));
        assert(env.OPENBLAS_NUM_THREADS === "1", `OPENBLAS_NUM_THREADS is ${env.OPENBLAS_NUM_THREADS}`);
        for (const k of Object.keys(env))
            assert(!/PASSWORD|SECRET|TOKEN|API_KEY/i.test(k), `ENV ${k} looks like a secret baked into the image`);
    });

    await check("Dockerfile: EXPOSE 8080, STOPSIGNAL SIGTERM", () => {
        const exposed = finalOf("EXPOSE").flatMap((i) => i.rest.split(/\s+/));
        assert(exposed.includes("8080") || exposed.includes("8080/tcp"), `EXPOSE is ${exposed.join(" ") || "missing"}`);
        const sig = finalOf("STOPSIGNAL").map((i) => i.rest.trim());
        assert(sig.length === 1 && sig[0] === "SIGTERM", `STOPSIGNAL is ${sig.join(" ") || "missing"}`);
    });

    await check("Dockerfile: HEALTHCHECK runs attnd --healthcheck (exec form, with timings)", () => {
        const hc = finalOf("HEALTHCHECK");
        assert(hc.length === 1, `expected one HEALTHCHECK, found ${hc.length}`);
        const { flags, rest } = splitFlags(hc[0].rest);
        assert(/^CMD\s/.test(rest), "HEALTHCHECK is not CMD ...");
        const argv = execForm(rest.slice(3));
        assert(argv, "HEALTHCHECK CMD is in shell form (needs a shell in the image)");
        assert(/(^|\/)attnd$/.test(argv[0]) && argv.includes("--healthcheck"), `HEALTHCHECK runs ${argv.join(" ")}`);
        for (const f of ["interval", "timeout", "retries", "start-period"])
            assert(flags[f] !== undefined, `HEALTHCHECK has no --${f}`);
    });

    await check("Dockerfile: ENTRYPOINT is attnd --host 0.0.0.0 in exec form", () => {
        const eps = finalOf("ENTRYPOINT");
        assert(eps.length === 1, `expected one ENTRYPOINT, found ${eps.length}`);
        const argv = execForm(eps[0].rest);
        assert(argv, "ENTRYPOINT is in shell form (SIGTERM would go to a shell, not attnd)");
        assert(/(^|\/)attnd$/.test(argv[0]), `ENTRYPOINT runs ${argv[0]}`);
        const host = argv.indexOf("--host");
        assert((host > 0 && argv[host + 1] === "0.0.0.0") || argv.includes("--host=0.0.0.0"), "ENTRYPOINT does not pass --host 0.0.0.0");
        const copied = finalOf("COPY").map((c) => splitFlags(c.rest).rest.split(/\s+/).pop());
        assert(copied.some((dst) => dst === "/usr/local/bin/attnd" || dst === "/usr/local/bin/"), "attnd is not copied to /usr/local/bin (on PATH)");
    });

    await check("Dockerfile: /models exists for mounted model files", () => {
        assert(final.instrs.some((i) => i.keyword === "RUN" && /mkdir -p [^&;]*\/models\b/.test(i.rest)), "no mkdir -p /models");
    });

    await check(".dockerignore: the context holds the sources COPY names and not build/, .git, tests/", () => {
        assert(fs.existsSync(DOCKERIGNORE), "no .dockerignore");
        const patterns = fs.readFileSync(DOCKERIGNORE, "utf8").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
        for (const c of instrs.filter((i) => i.keyword === "COPY")) {
            const { flags, rest } = splitFlags(c.rest);
            if (flags.from) continue;
            const srcs = rest.split(/\s+/).slice(0, -1);
            for (const s of srcs) {
                const p = s.replace(/\/$/, "");
                assert(fs.existsSync(path.join(ROOT, p)), `COPY ${s}: no such path in the repository`);
                assert(!dockerignored(patterns, p), `COPY ${s}: excluded by .dockerignore`);
                if (fs.statSync(path.join(ROOT, p)).isDirectory()) {
                    for (const f of fs.readdirSync(path.join(ROOT, p)).filter((f) => /\.[ch]$/.test(f)))
                        assert(!dockerignored(patterns, `${p}/${f}`), `${p}/${f} is excluded by .dockerignore`);
                }
            }
        }
        for (const p of ["build/attnd", ".git/HEAD", "tests/run.sh", "deploy/README.md", "build/engine/sdpa.o", "tests/deploy/node_modules/x"])
            assert(dockerignored(patterns, p), `${p} is not excluded by .dockerignore`);
    });
}

// ---- runtime-packages ----------------------------------------------------------------------

function runtimePackages() {
    const { final } = finalStage();
    const pkgs = final.instrs.filter((i) => i.keyword === "RUN").flatMap((i) => aptInstallPackages(i.rest));
    for (const p of pkgs) console.log(p);
}

// ---- build-context -----------------------------------------------------------------------

/* The build stage's RUN steps after its COPYs need only what the COPYs bring in: prints the
 * sources of the first stage's COPY instructions (relative to the context), one a line. */
function buildContext() {
    const { all } = finalStage();
    for (const c of all[0].instrs.filter((i) => i.keyword === "COPY")) {
        const { flags, rest } = splitFlags(c.rest);
        if (flags.from) continue;
        for (const src of rest.split(/\s+/).slice(0, -1)) console.log(`copy ${src.replace(/\/$/, "")}`);
    }
}

// ---- usage ---------------------------------------------------------------------------------

function* walk(dir) {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) yield* walk(p);
        else yield p;
    }
}

function flagsOf(argv) {
    return argv.filter((a) => /^--[a-z]/.test(a)).map((a) => a.slice(2).split("=")[0]);
}

/* Containers (objects with a name and an image) anywhere in a parsed manifest. */
function* containersIn(node) {
    if (Array.isArray(node)) {
        for (const v of node) yield* containersIn(v);
    } else if (node && typeof node === "object") {
        if (typeof node.image === "string" && typeof node.name === "string") yield node;
        for (const v of Object.values(node)) yield* containersIn(v);
    }
}

function usage() {
    const out = new Set();
    const add = (kind, name, file) => out.add(`${kind} ${name} ${rel(file)}`);

    const { final } = finalStage();
    for (const ins of final.instrs) {
        if (ins.keyword === "ENV")
            for (const [k] of envPairs(ins.rest)) if (k.startsWith("ATTND_")) add("env", k, DOCKERFILE);
        let argv = null;
        if (ins.keyword === "ENTRYPOINT" || ins.keyword === "CMD") argv = execForm(ins.rest);
        if (ins.keyword === "HEALTHCHECK") argv = execForm(splitFlags(ins.rest).rest.replace(/^CMD\s+/, ""));
        if (argv && (ins.keyword === "CMD" || /(^|\/)attnd$/.test(argv[0] || "")))
            for (const f of flagsOf(argv)) add("flag", f, DOCKERFILE);
    }

    for (const file of walk(path.join(ROOT, "deploy"))) {
        if (file.endsWith(".env")) {
            for (const line of fs.readFileSync(file, "utf8").split("\n")) {
                const m = /^\s*([A-Z_][A-Z0-9_]*)=/.exec(line);
                if (m && m[1].startsWith("ATTND_")) add("env", m[1], file);
            }
            continue;
        }
        if (!/\.ya?ml$/.test(file)) continue;
        const compose = /docker-compose\.ya?ml$|compose\.ya?ml$/.test(file);
        for (const doc of loadYamlFile(file, { merge: compose })) {
            if (compose) {
                for (const svc of Object.values(doc.services || {})) {
                    if (!/attnd/.test(svc.image || "")) continue;
                    const env = Array.isArray(svc.environment)
                        ? svc.environment.map((e) => e.split("=")[0])
                        : Object.keys(svc.environment || {});
                    for (const k of env) if (k.startsWith("ATTND_")) add("env", k, file);
                    const cmd = typeof svc.command === "string" ? svc.command.split(/\s+/) : svc.command || [];
                    for (const f of flagsOf(cmd)) add("flag", f, file);
                    const test = svc.healthcheck && svc.healthcheck.test;
                    if (Array.isArray(test) && test.some((t) => /(^|\/)attnd$/.test(t)))
                        for (const f of flagsOf(test)) add("flag", f, file);
                }
                continue;
            }
            if (doc.kind === "Kustomization") {
                for (const g of doc.configMapGenerator || [])
                    for (const lit of g.literals || []) {
                        const k = lit.split("=")[0];
                        if (k.startsWith("ATTND_")) add("env", k, file);
                    }
                continue;
            }
            if (doc.kind === "ConfigMap")
                for (const k of Object.keys(doc.data || {})) if (k.startsWith("ATTND_")) add("env", k, file);
            for (const c of containersIn(doc)) {
                if (!/attnd/.test(c.image)) continue;
                for (const e of c.env || []) if (e.name.startsWith("ATTND_")) add("env", e.name, file);
                for (const f of flagsOf([...(c.command || []), ...(c.args || [])])) add("flag", f, file);
            }
        }
    }
    for (const line of [...out].sort()) console.log(line);
}

// ---- configs -------------------------------------------------------------------------------

/* Every configuration of attnd that deploy/ defines, one per line as tab-separated words:
 * the name, then ATTND_*=value assignments and --flag=value arguments. check_live.sh starts
 * attnd with each to prove the values parse, lie within bounds and take effect. --model is left
 * out (no model file exists here; loading is not in the daemon yet). */
function configs() {
    const lines = [];
    const emit = (name, env, args = []) => {
        const words = [name, ...Object.entries(env).map(([k, v]) => `${k}=${v}`), ...args.filter((a) => !a.startsWith("--model"))];
        for (const w of words) if (/[\t\n]/.test(w)) throw new Error(`${name}: a value holds a tab or newline`);
        lines.push(words.join("\t"));
    };
    const readEnvFile = (file) => {
        const env = {};
        for (const line of fs.readFileSync(file, "utf8").split("\n")) {
            const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line.trim());
            if (m) env[m[1]] = m[2];
        }
        return env;
    };
    // A kustomization's ConfigMap attnd-config: its resources' (recursively), then its own
    // generator, merged as kustomize's behavior: merge does.
    const kustomizeEnv = (dir) => {
        const [k] = loadYamlFile(path.join(dir, "kustomization.yaml"));
        const env = {};
        for (const r of k.resources || []) {
            const sub = path.resolve(dir, r);
            if (fs.existsSync(path.join(sub, "kustomization.yaml"))) Object.assign(env, kustomizeEnv(sub));
        }
        for (const g of k.configMapGenerator || []) {
            if (g.name !== "attnd-config") continue;
            for (const e of g.envs || []) Object.assign(env, readEnvFile(path.join(dir, e)));
            for (const lit of g.literals || []) env[lit.slice(0, lit.indexOf("="))] = lit.slice(lit.indexOf("=") + 1);
        }
        for (const c of k.components || []) Object.assign(env, kustomizeEnv(path.resolve(dir, c)));
        return env;
    };
    const k8s = path.join(ROOT, "deploy", "k8s");
    emit("k8s/base", kustomizeEnv(path.join(k8s, "base")));
    for (const o of fs.readdirSync(path.join(k8s, "overlays")).sort())
        emit(`k8s/overlays/${o}`, kustomizeEnv(path.join(k8s, "overlays", o)));
    const [compose] = loadYamlFile(path.join(ROOT, "deploy", "compose", "docker-compose.yml"), { merge: true });
    for (const [name, svc] of Object.entries(compose.services))
        if (/attnd/.test(svc.image || "")) emit(`compose/${name}`, svc.environment || {}, svc.command || []);
    for (const f of ["cluster-serving-runtime.yaml"]) {
        for (const doc of loadYamlFile(path.join(ROOT, "deploy", "kserve", f)))
            for (const c of containersIn(doc))
                if (/attnd/.test(c.image))
                    emit(`kserve/${doc.metadata.name}`, Object.fromEntries((c.env || []).filter((e) => e.name.startsWith("ATTND_")).map((e) => [e.name, e.value])), c.args || []);
    }
    for (const l of lines) console.log(l);
}

// ---- main ----------------------------------------------------------------------------------

const mode = process.argv[2];
if (mode === "lint") {
    await lint();
    finish();
} else if (mode === "runtime-packages") {
    runtimePackages();
} else if (mode === "usage") {
    usage();
} else if (mode === "configs") {
    configs();
} else if (mode === "build-context") {
    buildContext();
} else {
    console.error("usage: node image.mjs lint|runtime-packages|usage|configs|build-context");
    process.exitCode = 2;
}
