// inspector.test.mjs - the attention inspector (GET /) in a real browser: Debian's chromium,
// driven by playwright-core, against a real attnd on an ephemeral port.
//
//   node --test tests/browser/inspector.test.mjs        (tests/browser/run.sh adds the
//                                                         "N passed, N failed" line)
//
// ATTND_BIN names the daemon (default build/attnd), CHROMIUM the browser (default
// /usr/bin/chromium). Every check compares what the page draws with what the API answers to
// the same request sent directly, so the page cannot pass by drawing its own numbers. The
// tests share one daemon (serving the demo layer, a small registered layer, "tiny", from a
// safetensors file written here, and the two layers of tests/api/hf/cases/llama as "llama") and
// one browser page, and run in order; they write the
// screenshots build/browser/inspector.png (the demo layer) and inspector-preset.png, and end
// by stopping the daemon, which must exit 0 with no sanitizer report.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
const ATTND = path.resolve(process.env.ATTND_BIN || path.join(repo, 'build/attnd'));
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.join(repo, 'build/browser');
// The flags this machine's Chromium needs (no sandbox as root, no GPU, no background traffic
// to hosts a closed network cannot reach), plus a fresh profile per run (launchPersistentContext).
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

// The golden case 2 of tests/engine/cases/seed_cases.json, as the preset must send it.
const GOLDEN = {
  query: [[1, 0], [0, 1], [1, 1]],
  key: [[1, 0], [0, 1], [1, 1]],
  value: [[1, 0], [0, 2], [3, 1]],
  weights: [[1, 0, 0], [0.33023845, 0.66976155, 0], [0.24825508, 0.24825508, 0.50348984]],
};

// The registered layer: nn.MultiheadAttention's state dict for E = 8 and 2 heads.
const TINY = { name: 'tiny', embed_dim: 8, num_heads: 2 };

let daemon;
let base;
let profile;
let context;
let page;
const problems = []; // console errors, page errors, failed requests, HTTP errors

// Writes a safetensors file (F32, little-endian) holding `tensors` {name: [shape, values]}.
function writeSafetensors(file, tensors, metadata) {
  const header = { __metadata__: metadata };
  const blobs = [];
  let offset = 0;
  for (const [name, [shape, values]] of Object.entries(tensors)) {
    const blob = Buffer.from(new Float32Array(values).buffer);
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + blob.length] };
    blobs.push(blob);
    offset += blob.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);
  const size = Buffer.alloc(8);
  size.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(file, Buffer.concat([size, Buffer.from(json), ...blobs]));
}
function tinyLayer(file) {
  const E = TINY.embed_dim;
  let x = 12345;
  const values = (n) => Array.from({ length: n }, () => {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    return ((x >>> 8) / 2 ** 24 - 0.5) * 0.8;
  });
  writeSafetensors(file, {
    in_proj_weight: [[3 * E, E], values(3 * E * E)],
    in_proj_bias: [[3 * E], values(3 * E)],
    'out_proj.weight': [[E, E], values(E * E)],
    'out_proj.bias': [[E], values(E)],
  }, { num_heads: String(TINY.num_heads) });
}

async function startDaemon(extra = []) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-browser-'));
  const portFile = path.join(dir, 'port');
  const layer = path.join(dir, 'tiny.safetensors');
  tinyLayer(layer);
  const log = [];
  const child = spawn(ATTND, ['--host', '127.0.0.1', '--port', '0', '--port-file', portFile,
    '--model', `${TINY.name}=${layer}`, '--model', `llama=${path.join(repo, 'tests/api/hf/cases/llama')}`,
    ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  child.stderr.on('data', (d) => log.push(d.toString()));
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  for (let i = 0; i < 200; i++) {
    const text = fs.existsSync(portFile) ? fs.readFileSync(portFile, 'utf8').trim() : '';
    if (/^\d+$/.test(text)) return { child, dir, exited, log, port: Number(text) };
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  child.kill('SIGKILL');
  throw new Error(`${ATTND} did not start:\n${log.join('').slice(-2000)}`);
}

async function post(route, body) {
  const res = await fetch(`${base}${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  assert.equal(res.status, 200, `${route}: ${await res.clone().text()}`);
  return res.json();
}

// Weights of a reply as [H][L][S] (rank-2 inputs: no batch axis).
function perHead(w) {
  return Array.isArray(w[0][0]) ? w : [w];
}

const runCount = () => page.$eval('#results', (r) => Number(r.dataset.run));
// Waits until the page has drawn a reply after render number `n`.
async function renderedAfter(n) {
  await page.waitForFunction((k) => {
    const r = document.getElementById('results');
    return Number(r.dataset.run) > k && r.dataset.state === 'ready';
  }, n, { timeout: 15000 });
}
// Performs `action` (which makes the page compute) and waits for the new render.
async function andRender(action) {
  const n = await runCount();
  await action();
  await renderedAfter(n);
}

// Every heatmap as drawn: its key, title, labels and the cells' values (from data-value).
function readMaps() {
  return page.$$eval('figure.heatmap', (figs) => figs.map((f) => {
    const t = f.querySelector('table');
    return {
      key: f.dataset.key,
      title: f.querySelector('h3').textContent,
      rows: [...t.tBodies[0].rows].map((r) => r.cells[0].textContent),
      cols: [...t.tHead.rows[0].cells].slice(1).map((c) => c.title),
      values: [...t.tBodies[0].rows].map((r) => [...r.querySelectorAll('td')].map((c) => Number(c.dataset.value))),
      masked: [...t.tBodies[0].rows].map((r) => [...r.querySelectorAll('td')].map((c) => c.classList.contains('masked'))),
    };
  }));
}
// The body the page sent, from its "Request sent" panel: "POST /v1/...\n{json}".
async function sentRequest() {
  const text = await page.textContent('#request-json');
  const nl = text.indexOf('\n');
  return { route: text.slice(5, nl), body: JSON.parse(text.slice(nl + 1)) };
}
function assertClose(actual, expected, tol, what) {
  assert.equal(actual.length, expected.length, `${what}: row count`);
  actual.forEach((row, i) => {
    assert.equal(row.length, expected[i].length, `${what}: row ${i} length`);
    row.forEach((v, j) => assert.ok(Math.abs(v - expected[i][j]) <= tol,
      `${what}[${i}][${j}] = ${v}, expected ${expected[i][j]} (tolerance ${tol})`));
  });
}

describe('attention inspector', { timeout: 120000 }, () => {
  before(async () => {
    daemon = await startDaemon();
    base = `http://127.0.0.1:${daemon.port}`;
    profile = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-chromium-'));
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM, headless: true, args: FLAGS,
      viewport: { width: 1280, height: 900 }, deviceScaleFactor: 1, reducedMotion: 'reduce',
    });
    page = context.pages()[0] || (await context.newPage());
    page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    // A run the page supersedes (a newer input) is aborted by design, through its AbortController.
    page.on('requestfailed', (r) => {
      const why = r.failure()?.errorText;
      if (why !== 'net::ERR_ABORTED') problems.push(`request failed: ${r.url()} ${why}`);
    });
    page.on('response', (r) => { if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`); });
  });

  after(async () => {
    await context?.close().catch(() => {});
    if (profile) fs.rmSync(profile, { recursive: true, force: true });
    if (daemon) {
      if (daemon.child.exitCode === null && daemon.child.signalCode === null) daemon.child.kill('SIGKILL');
      await daemon.exited;
      fs.rmSync(daemon.dir, { recursive: true, force: true });
    }
  });

  test('GET / serves the page with a hash-based CSP, no-cache and an ETag', async () => {
    const res = await fetch(`${base}/`);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'text/html; charset=utf-8');
    const csp = res.headers.get('content-security-policy');
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /script-src 'sha256-[A-Za-z0-9+/]{43}='/);
    assert.match(csp, /style-src 'sha256-[A-Za-z0-9+/]{43}='/);
    assert.match(csp, /connect-src 'self'/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|\*/);
    assert.equal(res.headers.get('cache-control'), 'no-cache');
    assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
    const etag = res.headers.get('etag');
    assert.match(etag, /^"[0-9a-f]{32}"$/);
    const html = await res.text();
    assert.match(html, /^<!doctype html>/);
    assert.doesNotMatch(html, /https?:\/\/(?!127\.)/, 'the page loads nothing from the network');

    const again = await fetch(`${base}/`, { headers: { 'If-None-Match': `"x", W/${etag}` } });
    assert.equal(again.status, 304);
    assert.equal(await again.text(), '');
    const other = await fetch(`${base}/`, { headers: { 'If-None-Match': '"0000"' } });
    assert.equal(other.status, 200);
    const head = await fetch(`${base}/`, { method: 'HEAD' });
    assert.equal(head.status, 200);
    assert.equal(head.headers.get('etag'), etag);
    const wrong = await fetch(`${base}/`, { method: 'POST', body: '{}' });
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get('allow'), 'GET, HEAD');
  });

  test('the page loads and draws the golden preset with no console errors', async () => {
    await page.goto(`${base}/`);
    await renderedAfter(0);
    assert.equal(await page.title(), 'attnd · attention inspector');
    assert.equal(await page.$eval('input[name=mode]:checked', (e) => e.value), 'preset');
    // The golden case's numbers are on the page: inputs and expected weights.
    const inputs = await page.textContent('#preset-rows');
    for (const s of ['(1, 0)', '(0, 1)', '(1, 1)', '(0, 2)', '(3, 1)']) assert.ok(inputs.includes(s), s);
    const golden = await page.textContent('#golden');
    for (const s of ['0.33023845', '0.66976155', '0.24825508', '0.50348984']) assert.ok(golden.includes(s), s);
    assert.deepEqual(problems, []);
  });

  test('the preset heatmap shows exactly the weights the API returns', async () => {
    const maps = await readMaps();
    assert.equal(maps.length, 1, 'one head: one heatmap');
    assert.deepEqual(maps[0].rows, ['x₁', 'x₂', 'x₃']);
    const sent = await sentRequest();
    assert.equal(sent.route, '/v1/attention');
    const { weights: _expected, ...inputs } = GOLDEN;
    assert.deepEqual(sent.body, { ...inputs, num_heads: 1, causal: true, return_weights: 'per_head' });
    const reply = await post('/v1/attention', sent.body);
    assert.deepEqual(maps[0].values, perHead(reply.weights)[0], 'cells equal the API weights');
    assertClose(maps[0].values, GOLDEN.weights, 1e-5, 'golden weights');
    assert.equal(await page.getAttribute('#golden', 'data-match'), 'yes');
  });

  test('toggling causal fills and then zeroes the upper triangle', async () => {
    await andRender(() => page.uncheck('#causal'));
    let [map] = await readMaps();
    const sent = await sentRequest();
    assert.equal(sent.body.causal, false);
    const open = await post('/v1/attention', sent.body);
    assert.deepEqual(map.values, perHead(open.weights)[0]);
    for (let i = 0; i < 3; i++) {
      for (let j = i + 1; j < 3; j++) {
        assert.ok(map.values[i][j] > 0, `without the mask, [${i}][${j}] > 0`);
        assert.equal(map.masked[i][j], false);
      }
    }
    assert.equal(await page.getAttribute('#golden', 'data-match'), 'n/a');

    await andRender(() => page.check('#causal'));
    [map] = await readMaps();
    for (let i = 0; i < 3; i++) {
      for (let j = 0; j < 3; j++) {
        if (j > i) {
          assert.equal(map.values[i][j], 0, `causal: [${i}][${j}] is 0`);
          assert.equal(map.masked[i][j], true, `causal: [${i}][${j}] is drawn as masked`);
        } else {
          assert.ok(map.values[i][j] > 0);
        }
      }
    }
    assert.equal(await page.getAttribute('#golden', 'data-match'), 'yes');
  });

  test('scaling off sends "scale": 1 and draws the sharper weights the API returns', async () => {
    const [scaled] = await readMaps();
    await andRender(() => page.uncheck('#scaled'));
    const [unscaled] = await readMaps();
    const sent = await sentRequest();
    assert.equal(sent.body.scale, 1);
    const reply = await post('/v1/attention', sent.body);
    assert.deepEqual(unscaled.values, perHead(reply.weights)[0]);
    // Row 2 attends to x₁ and x₂ with scores 0 and 1: the larger weight grows without 1/√2.
    assert.ok(unscaled.values[1][1] > scaled.values[1][1]);
    await andRender(() => page.check('#scaled'));
    assert.equal((await sentRequest()).body.scale, undefined);
  });

  test('raw Q, K, V with two heads draws one heatmap per head and their mean', async () => {
    await andRender(() => page.check('input[name=mode][value=raw]'));
    await page.fill('#raw-sentence', 'attention is all you need');
    await page.fill('#raw-width', '8');
    await page.fill('#heads', '2');
    await andRender(() => page.click('#fill'));
    const maps = await readMaps();
    assert.deepEqual(maps.map((m) => m.key), ['head-0', 'head-1', 'mean']);
    for (const m of maps) {
      assert.deepEqual(m.rows, ['attention', 'is', 'all', 'you', 'need']);
      assert.deepEqual(m.cols, ['attention', 'is', 'all', 'you', 'need']);
    }
    const sent = await sentRequest();
    assert.equal(sent.body.num_heads, 2);
    assert.equal(sent.body.query.length, 5);
    assert.equal(sent.body.query[0].length, 8);
    const reply = await post('/v1/attention', sent.body);
    assert.deepEqual(maps[0].values, reply.weights[0]);
    assert.deepEqual(maps[1].values, reply.weights[1]);
    const mean = await post('/v1/attention', { ...sent.body, return_weights: 'mean' });
    assertClose(maps[2].values, mean.weights, 1e-6, 'mean heatmap vs "return_weights": "mean"');
    // Heads that do not divide the width are refused on the page, before any request.
    const n = await runCount();
    await page.fill('#heads', '3');
    await page.dispatchEvent('#heads', 'change');
    await page.waitForSelector('#error:not([hidden])');
    assert.match(await page.textContent('#error'), /3 heads do not divide the width E = 8/);
    assert.equal(await page.getAttribute('#heads', 'aria-invalid'), 'true');
    assert.equal(await runCount(), n);
    await andRender(async () => { await page.fill('#heads', '2'); await page.dispatchEvent('#heads', 'change'); });
    assert.equal(await page.isHidden('#error'), true);
  });

  test('an error from the API is shown with its status, message and field', async () => {
    const q = await page.inputValue('#raw-q');
    await page.fill('#raw-q', q.replace(/^\S+/, '1e39')); // finite in JS, not as float32
    await page.focus('#raw-q');
    await page.keyboard.press('Control+Enter');
    await page.waitForSelector('#error:not([hidden])');
    const text = await page.textContent('#error');
    assert.match(text, /^The server answered 422: /);
    assert.match(text, /\(field query/);
    assert.equal(await page.getAttribute('#results', 'data-state'), 'error');
    // The one expected failure: the 422 itself, which the browser also logs.
    const expected = problems.splice(0).filter((p) => !/\b422\b/.test(p));
    assert.deepEqual(expected, []);
    await andRender(async () => {
      await page.fill('#raw-q', q);
      await page.keyboard.press('Control+Enter');
    });
    assert.equal(await page.isHidden('#error'), true);
  });

  test('the keyboard moves focus across heatmap cells and reads their values', async () => {
    await page.focus('#compute');
    await page.keyboard.press('Tab');
    const at = () => page.evaluate(() => {
      const a = document.activeElement;
      return { grid: a.closest('figure')?.dataset.key, row: Number(a.dataset.row), col: Number(a.dataset.col), role: a.getAttribute('role') };
    });
    assert.deepEqual(await at(), { grid: 'head-0', row: 0, col: 0, role: 'gridcell' });
    await page.keyboard.press('ArrowRight');
    await page.keyboard.press('ArrowRight');
    await page.keyboard.press('ArrowDown');
    assert.deepEqual(await at(), { grid: 'head-0', row: 1, col: 2, role: 'gridcell' });
    await page.keyboard.press('End');
    assert.deepEqual(await at(), { grid: 'head-0', row: 1, col: 4, role: 'gridcell' });
    await page.keyboard.press('ArrowRight'); // stays at the edge
    assert.deepEqual(await at(), { grid: 'head-0', row: 1, col: 4, role: 'gridcell' });
    await page.keyboard.press('Control+End');
    assert.deepEqual(await at(), { grid: 'head-0', row: 4, col: 4, role: 'gridcell' });
    await page.keyboard.press('Home');
    await page.keyboard.press('PageUp');
    assert.deepEqual(await at(), { grid: 'head-0', row: 0, col: 0, role: 'gridcell' });
    await page.keyboard.press('ArrowDown');
    // The focused cell's value is in its accessible name, the tooltip and the readout.
    const value = await page.evaluate(() => Number(document.activeElement.dataset.value));
    const label = await page.evaluate(() => document.activeElement.getAttribute('aria-label'));
    assert.match(label, /^query 2 “is”, key 1 “attention”: /);
    assert.ok(label.includes(value.toFixed(4)));
    assert.equal(await page.isVisible('#tip'), true);
    assert.ok((await page.textContent('#tip')).includes(value.toFixed(4)));
    assert.ok((await page.textContent('#readout')).includes(value.toFixed(4)));
    // One tab stop per heatmap (roving tabindex): Tab goes to the next heatmap, and back to
    // the cell last visited.
    await page.keyboard.press('Tab');
    assert.deepEqual(await at(), { grid: 'head-1', row: 0, col: 0, role: 'gridcell' });
    await page.keyboard.press('Shift+Tab');
    assert.deepEqual(await at(), { grid: 'head-0', row: 1, col: 0, role: 'gridcell' });
    // Focus is visible: the focused cell draws an outline.
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.equal(outline, 'solid');
  });

  test('every control has a label', async () => {
    const unlabelled = await page.$$eval('input, select, textarea, button', (els) => els
      .filter((e) => e.type !== 'hidden')
      .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
      .map((e) => e.id || e.name || e.outerHTML.slice(0, 60)));
    assert.deepEqual(unlabelled, []);
  });

  test('the demo layer draws one heatmap per head plus the mean for a sentence', async () => {
    const models = await (await fetch(`${base}/v1/models`)).json();
    const demo = models.models.find((m) => m.name === 'demo');
    assert.ok(demo, 'GET /v1/models lists the demo layer');
    await andRender(() => page.check('input[name=mode][value=layer]'));
    await andRender(() => page.fill('#sentence', 'the cat sat on the mat because it was tired .'));
    const maps = await readMaps();
    const tokens = ['the', 'cat', 'sat', 'on', 'the', 'mat', 'because', 'it', 'was', 'tired', '.'];
    assert.equal(maps.length, demo.num_heads + 1);
    assert.deepEqual(maps.map((m) => m.key), [...Array.from({ length: demo.num_heads }, (_, h) => `head-${h}`), 'mean']);
    for (const m of maps) {
      assert.deepEqual(m.rows, tokens);
      assert.deepEqual(m.cols, tokens);
    }
    const sent = await sentRequest();
    assert.equal(sent.route, '/v1/mha');
    assert.equal(sent.body.model, 'demo');
    assert.equal(sent.body.input.length, tokens.length);
    assert.equal(sent.body.input[0].length, demo.embed_dim);
    // The documented token mapping: the same word, the same vector.
    assert.deepEqual(sent.body.input[0], sent.body.input[4]);
    assert.deepEqual(sent.body.input[0], documentedEmbedding('the', demo.embed_dim));
    const reply = await post('/v1/mha', sent.body);
    const heads = perHead(reply.weights);
    for (let h = 0; h < demo.num_heads; h++) assert.deepEqual(maps[h].values, heads[h], `head ${h}`);
    for (let i = 0; i < tokens.length; i++) {
      for (let j = i + 1; j < tokens.length; j++) assert.equal(maps[0].values[i][j], 0);
    }
    assert.equal(await page.isDisabled('#heads'), true);
    assert.equal(await page.inputValue('#heads'), String(demo.num_heads));
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.mouse.move(0, 0);
    await page.focus('#compute');
    await page.hover('figure[data-key="head-1"] td[data-row="5"][data-col="1"]');
    await page.screenshot({ path: path.join(SHOTS, 'inspector.png'), fullPage: true });
  });

  test('a registered layer from /v1/models draws its own heads at its own width', async () => {
    const options = await page.$$eval('#model option', (os) => os.map((o) => o.value));
    assert.deepEqual(options, ['demo', TINY.name, 'llama/0', 'llama/1']);
    await andRender(() => page.fill('#sentence', 'small layers attend too'));
    await andRender(() => page.selectOption('#model', TINY.name));
    assert.match(await page.textContent('#model-info'), /width E = 8, 2 heads, head width d = 4/);
    assert.equal(await page.inputValue('#heads'), '2');
    const maps = await readMaps();
    assert.deepEqual(maps.map((m) => m.key), ['head-0', 'head-1', 'mean']);
    const sent = await sentRequest();
    assert.equal(sent.body.model, TINY.name);
    assert.deepEqual(sent.body.input.map((r) => r.length), [8, 8, 8, 8]);
    const reply = await post('/v1/mha', sent.body);
    assert.deepEqual(maps[0].values, reply.weights[0]);
    assert.deepEqual(maps[1].values, reply.weights[1]);
    await andRender(() => page.selectOption('#model', 'demo'));
  });

  test('a model of two layers is one choice per layer, each sent with its layer', async () => {
    const labels = await page.$$eval('#model option', (os) => os.map((o) => o.textContent));
    assert.deepEqual(labels.slice(2), ['llama, layer 0', 'llama, layer 1']);
    assert.equal(await page.isChecked('#causal'), true); // a decoder layer is causal
    await andRender(() => page.fill('#sentence', 'every layer answers'));
    await andRender(() => page.selectOption('#model', 'llama/1'));
    const sent = await sentRequest();
    assert.equal(sent.body.model, 'llama');
    assert.equal(sent.body.layer, 1);
    const maps = await readMaps();
    const reply = await post('/v1/mha', sent.body);
    assert.deepEqual(maps[0].values, reply.weights[0]);
    await andRender(() => page.selectOption('#model', 'demo'));
  });

  test('the preset screenshot and a clean session: no console errors, no failed requests', async () => {
    await andRender(() => page.check('input[name=mode][value=preset]'));
    await page.focus('#compute');
    await page.hover('figure[data-key="head-0"] td[data-row="1"][data-col="1"]');
    await page.screenshot({ path: path.join(SHOTS, 'inspector-preset.png'), fullPage: true });
    assert.deepEqual(problems, []);
  });

  test('the daemon drains and exits 0, with no sanitizer report', async () => {
    await context.close();
    context = null;
    daemon.child.kill('SIGTERM');
    const end = await Promise.race([daemon.exited, new Promise((r) => setTimeout(() => r('timeout'), 15000).unref())]);
    const log = daemon.log.join('');
    assert.deepEqual(end, { code: 0, signal: null }, log.slice(-2000));
    assert.doesNotMatch(log, /Sanitizer|runtime error:/, log.slice(-2000));
  });
});

// The token mapping the page documents: FNV-1a of the lower-cased UTF-8 bytes seeds
// mulberry32; Box-Muller draws N(0, 1) pairs; each rounded to 3 decimals.
function documentedEmbedding(token, width) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(token.toLowerCase(), 'utf8')) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  let a = h >>> 0;
  const rand = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const v = [];
  while (v.length < width) {
    const r = Math.sqrt(-2 * Math.log(1 - rand()));
    const theta = 2 * Math.PI * rand();
    v.push(r * Math.cos(theta));
    if (v.length < width) v.push(r * Math.sin(theta));
  }
  return v.map((x) => Math.round(x * 1000) / 1000 || 0);
}

// With --auth-token-file the page meets 401s: it asks for the token, keeps it in memory only,
// and sends it with every later call.
describe('attention inspector with bearer tokens', { timeout: 120000 }, () => {
  const TOKEN = 'browser-test-token-0123456789';
  let authDaemon;
  let authProfile;
  let authContext;
  let authPage;
  const sent = []; // the Authorization header of each API call the page made

  before(async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-browser-tokens-'));
    fs.writeFileSync(path.join(dir, 'tokens'), `# test\n${TOKEN}\n`);
    authDaemon = await startDaemon(['--auth-token-file', path.join(dir, 'tokens')]);
    authDaemon.tokenDir = dir;
    authProfile = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-chromium-'));
    authContext = await chromium.launchPersistentContext(authProfile, {
      executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1280, height: 900 },
    });
    authPage = authContext.pages()[0] || (await authContext.newPage());
    authPage.on('request', (r) => {
      if (new URL(r.url()).pathname.startsWith('/v1/')) sent.push(r.headers().authorization || '');
    });
  });

  after(async () => {
    await authContext?.close().catch(() => {});
    if (authProfile) fs.rmSync(authProfile, { recursive: true, force: true });
    if (authDaemon) {
      if (authDaemon.child.exitCode === null && authDaemon.child.signalCode === null) authDaemon.child.kill('SIGTERM');
      await authDaemon.exited;
      fs.rmSync(authDaemon.dir, { recursive: true, force: true });
      fs.rmSync(authDaemon.tokenDir, { recursive: true, force: true });
    }
  });

  test('a 401 asks for the token; with it the page computes and keeps it nowhere but memory', async () => {
    await authPage.goto(`http://127.0.0.1:${authDaemon.port}/`);
    await authPage.waitForSelector('#auth:not([hidden])', { timeout: 15000 });
    assert.match(await authPage.textContent('#error'), /401/);
    assert.ok(sent.length > 0 && sent.every((h) => h === ''), `before the token: ${sent}`);
    const n = await authPage.$eval('#results', (r) => Number(r.dataset.run));
    await authPage.fill('#token', TOKEN);
    await authPage.click('#auth button[type=submit]');
    await authPage.waitForFunction((k) => {
      const r = document.getElementById('results');
      return Number(r.dataset.run) > k && r.dataset.state === 'ready';
    }, n, { timeout: 15000 });
    assert.equal(await authPage.$eval('#auth', (f) => f.hidden), true);
    assert.equal(await authPage.inputValue('#token'), '');
    assert.equal(sent[sent.length - 1], `Bearer ${TOKEN}`);
    const stored = await authPage.evaluate(() => JSON.stringify([{ ...localStorage }, { ...sessionStorage }, document.cookie, location.href]));
    assert.doesNotMatch(stored, new RegExp(TOKEN));
    const cookies = await authContext.cookies();
    assert.equal(cookies.length, 0);
    assert.doesNotMatch(authDaemon.log.join(''), new RegExp(TOKEN));
  });
});
