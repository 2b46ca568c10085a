// MegaScope UI: polls the typed JSON API of mapp-scope and redraws. The only
// write is POST /api/control with a switch id, a boolean and a number.
'use strict';

const $ = id => document.getElementById(id);
const P = window.MegaPlots;
const state = { run: null, probes: [], switchesShown: '' };

async function api(path) {
  const r = await fetch(path, { cache: 'no-store' });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

function setOptions(select, items, keep) {
  const old = select.value;
  select.replaceChildren(...items.map(([value, label]) => {
    const o = document.createElement('option');
    o.value = String(value);
    o.textContent = label;
    return o;
  }));
  if (keep && items.some(([v]) => String(v) === old)) select.value = old;
}

function reductionsOf(p) { return p.reduce.split(',').filter(Boolean); }

async function loadRuns() {
  const runs = await api('/api/runs');
  setOptions($('run'), runs.map(r => [r.id, `${r.id} ${r.name || ''} (${r.meta.mode || 'train'})`]), true);
  if (!$('run').value && runs.length) $('run').value = String(runs[runs.length - 1].id);
  state.run = $('run').value ? Number($('run').value) : null;
}

async function loadProbes() {
  state.probes = await api(`/api/probes?run=${state.run}`);
  const scalar = state.probes.filter(p => reductionsOf(p).some(r =>
    ['max', 'min', 'mean', 'std', 'absmax', 'sparsity'].includes(r)));
  setOptions($('stat-probe'), scalar.map(p => [p.id, p.point]), true);
  setOptions($('hist-probe'), state.probes.filter(p => reductionsOf(p).includes('hist'))
    .map(p => [p.id, p.point]), true);
  setOptions($('attn-probe'), state.probes.filter(p => p.reduce === 'attn')
    .map(p => [p.id, p.point]), true);
  const sp = state.probes.find(p => String(p.id) === $('stat-probe').value);
  setOptions($('stat-red'), sp ? reductionsOf(sp).filter(r =>
    ['max', 'min', 'mean', 'std', 'absmax', 'sparsity'].includes(r)).map(r => [r, r]) : [], true);
  const ap = state.probes.find(p => String(p.id) === $('attn-probe').value);
  const heads = ap ? ap.attrs.heads : 0;
  setOptions($('attn-head'), [...Array(heads).keys()].map(h => [h, `head ${h}`]), true);
}

async function drawTraining() {
  const steps = await api(`/api/steps?run=${state.run}`);
  P.linePlot($('loss-plot'), [{ label: 'loss', points: steps.map(s => [s.step, s.loss]) }]);
}

async function drawStats() {
  const probe = $('stat-probe').value, red = $('stat-red').value;
  if (!probe || !red) return $('stat-plot').replaceChildren();
  const rows = await api(`/api/series?run=${state.run}&probe=${probe}&reduction=${red}`);
  const byRank = new Map();
  for (const r of rows) {
    if (!byRank.has(r.rank)) byRank.set(r.rank, []);
    byRank.get(r.rank).push([r.step, r.value]);
  }
  P.linePlot($('stat-plot'), [...byRank].map(([rank, points]) => ({ label: `rank ${rank}`, points })));
}

async function drawHist() {
  const probe = state.probes.find(p => String(p.id) === $('hist-probe').value);
  if (!probe) return $('hist-plot').replaceChildren();
  const s = await api(`/api/sample?run=${state.run}&probe=${probe.id}&reduction=hist`);
  if (!s) return;
  $('hist-step').textContent = `step ${s.step}`;
  P.barPlot($('hist-plot'), s.data, probe.attrs.lo, probe.attrs.hi);
}

async function drawAttention() {
  const probe = $('attn-probe').value, head = Number($('attn-head').value || 0);
  if (!probe) return;
  const phase = $('attn-phase').value;
  const s = await api(`/api/sample?run=${state.run}&probe=${probe}&reduction=attn&phase=${phase}`);
  if (!s) { $('attn-step').textContent = 'no samples'; return; }
  const [heads, rows, cols] = s.shape;
  $('attn-step').textContent = `${phase} step ${s.step}`;
  const h = Math.min(head, heads - 1);
  P.heatmap($('attn-canvas'), s.data.slice(h * rows * cols, (h + 1) * rows * cols), rows, cols);
}

async function drawPca() {
  const steps = await api(`/api/steps?run=${state.run}`);
  const sketch = state.probes.filter(p => reductionsOf(p).includes('sketch'));
  if (!sketch.length) { $('pca-info').textContent = 'no sketch probes'; return; }
  // Latest step that recorded sketches: the last step divisible by `every`.
  const every = Math.max(...sketch.map(p => p.every));
  const last = steps.length ? steps[steps.length - 1].step : 0;
  const step = last - (last % every);
  const r = await api(`/api/pca?run=${state.run}&step=${step}`);
  const points = sorted(r.points);
  $('pca-info').textContent = `step ${step}: PC1 ${(100 * r.explained[0]).toFixed(1)}%, ` +
    `PC2 ${(100 * r.explained[1]).toFixed(1)}% of variance; ${points.length} rows`;
  const ids = [...new Set(points.map(p => p.probe))];
  P.scatterPlot($('pca-plot'), points, p => `hsl(${360 * ids.indexOf(p.probe) / ids.length}, 65%, 45%)`);
}

function sorted(points) { return points.slice().sort((a, b) => a.probe - b.probe); }

async function drawGeneration() {
  const toks = await api(`/api/generation?run=${state.run}`);
  const box = $('gen-tokens');
  const sel = Number(box.dataset.sel || 0);
  box.replaceChildren(...toks.map((t, i) => {
    const s = document.createElement('span');
    s.textContent = t.text;
    s.title = `p=${t.prob.toFixed(3)}`;
    if (i === sel) s.className = 'sel';
    s.addEventListener('click', () => { box.dataset.sel = String(i); drawGeneration(); });
    return s;
  }));
  const t = toks[sel];
  if (!t) return $('gen-topk').replaceChildren();
  P.barPlot($('gen-topk'), t.topk.map(k => k.p), 0, t.topk.length);
  const list = document.createElement('div');
  list.className = 'muted';
  list.textContent = t.topk.slice(0, 10).map(k => `${JSON.stringify(k.text)} ${k.p.toFixed(3)}`).join('  ');
  $('gen-topk').appendChild(list);
}

async function sendControl(id, enabled, magnitude) {
  const body = JSON.stringify({ run: state.run, switch: id, enabled, magnitude });
  const r = await fetch('/api/control', { method: 'POST', body,
    headers: { 'Content-Type': 'application/json' } });
  const reply = await r.json();
  $('control-status').textContent = reply.ok ? `switch ${id}: sent` :
    `switch ${id}: ${reply.error || 'refused'}`;
}

async function drawSwitches() {
  const s = await api(`/api/switches?run=${state.run}`);
  const key = JSON.stringify(s.switches.map(x => x.id));
  if (key !== state.switchesShown) {
    state.switchesShown = key;
    $('switches').replaceChildren(...s.switches.map(sw => {
      const row = document.createElement('div');
      row.className = 'switch';
      const on = document.createElement('input');
      on.type = 'checkbox'; on.checked = sw.enabled; on.id = `switch-${sw.id}`;
      const mag = document.createElement('input');
      mag.type = 'number'; mag.step = 'any'; mag.value = String(sw.magnitude); mag.id = `mag-${sw.id}`;
      const apply = document.createElement('button');
      apply.textContent = 'apply'; apply.id = `apply-${sw.id}`;
      const label = document.createElement('label');
      label.htmlFor = on.id;
      label.textContent = `#${sw.id} ${sw.kind} on ${sw.point} (${sw.target})`;
      on.addEventListener('change', () => sendControl(sw.id, on.checked, Number(mag.value)));
      apply.addEventListener('click', () => sendControl(sw.id, on.checked, Number(mag.value)));
      row.append(on, label, mag, apply);
      return row;
    }));
  }
  $('control-status').dataset.endpoint = s.control;
  const body = $('control-log').tBodies[0];
  body.replaceChildren(...s.log.map(e => {
    const tr = document.createElement('tr');
    for (const v of [e.step, e.switch, e.enabled ? 'on' : 'off', e.magnitude, e.source]) {
      const td = document.createElement('td');
      td.textContent = String(v);
      tr.appendChild(td);
    }
    return tr;
  }));
}

async function refresh() {
  try {
    await loadRuns();
    if (state.run === null) { $('status').textContent = 'no runs in this database'; return; }
    await loadProbes();
    await Promise.all([drawTraining(), drawStats(), drawHist(), drawAttention(),
      drawPca(), drawGeneration(), drawSwitches()]);
    $('status').textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = '1';
  } catch (e) {
    $('status').textContent = `error: ${e.message}`;
  }
}

for (const id of ['run', 'stat-probe', 'stat-red', 'hist-probe', 'attn-probe', 'attn-head', 'attn-phase'])
  $(id).addEventListener('change', refresh);
refresh();
setInterval(refresh, 2000);
