// MegaScope's page: run and rank selectors, then every view redrawn from
// the typed JSON API (polling every 2 s for a live job). The only writes
// are POST /api/control (switch id, boolean, number) and POST /api/patch
// (prompts, site, layer, position, target): parameters, never code.
import './style.css';
import { api, qs } from './api.js';
import { clear } from './charts.js';
import { drawExperts, drawHist, drawStats, drawTraining } from './series.js';
import { drawAttention, drawHeatmap, drawLens, drawPca } from './tokens.js';
import { drawGeneration, drawPatches, drawSwitches, wirePatchForm } from './panels.js';

const $ = id => document.getElementById(id);
const SCALAR = ['max', 'min', 'mean', 'std', 'absmax', 'sparsity'];
const reductionsOf = p => p.reduce.split(',').filter(Boolean);

const ctx = {
  run: null, rank: 0, ranks: [], probes: [], seqLength: 0,
  rankLabel: r => {
    const x = ctx.ranks.find(k => k.rank === r);
    return x ? `rank ${r} (dp${x.dp} pp${x.pp} tp${x.tp})` : `rank ${r}`;
  },
  // Item counts per chart, read by the browser tests.
  setCount: (id, n) => { $(id).dataset.count = String(n); },
};

function setOptions(select, items) {
  const old = select.value;
  select.replaceChildren(...items.map(([value, label]) => {
    const o = document.createElement('option');
    o.value = String(value);
    o.textContent = label;
    return o;
  }));
  if (items.some(([v]) => String(v) === old)) select.value = old;
}

const onRank = p => p.ranks.split(',').map(Number).includes(ctx.rank);
const probeById = id => ctx.probes.find(p => String(p.id) === id);

async function loadRuns() {
  const runs = await api('/api/runs');
  setOptions($('run'), runs.map(r => [r.id, `${r.id} ${r.name || ''} (${r.meta.mode || 'train'})`]));
  if (!$('run').value && runs.length) $('run').value = String(runs[runs.length - 1].id);
  const run = $('run').value ? Number($('run').value) : null;
  const meta = runs.find(r => r.id === run)?.meta || {};
  ctx.seqLength = meta.seq_length || 0;
  if (run !== ctx.run) {
    ctx.run = run;
    ['loss-chart', 'stat-chart', 'heat-chart', 'attn-chart', 'lens-chart', 'pca-chart', 'hist-chart',
      'expert-chart', 'expert-imb-chart'].forEach(clear);
    // A run's own phase first: a generation run records only 'generate'.
    const phase = meta.mode === 'generate' ? 'generate' : 'train';
    for (const id of ['heat-phase', 'attn-phase', 'pca-phase', 'lens-phase']) $(id).value = phase;
  }
}

async function loadRanksAndProbes() {
  ctx.ranks = await api(`/api/ranks?${qs({ run: ctx.run })}`);
  setOptions($('rank'), ctx.ranks.map(r => [r.rank, ctx.rankLabel(r.rank)]));
  ctx.rank = Number($('rank').value || 0);
  ctx.probes = await api(`/api/probes?${qs({ run: ctx.run })}`);
  const here = ctx.probes.filter(onRank);
  const having = red => here.filter(p => reductionsOf(p).includes(red)).map(p => [p.id, p.point]);
  setOptions($('stat-probe'), ctx.probes.filter(p => reductionsOf(p).some(r => SCALAR.includes(r))).map(p => [p.id, p.point]));
  const sp = probeById($('stat-probe').value);
  setOptions($('stat-red'), sp ? reductionsOf(sp).filter(r => SCALAR.includes(r)).map(r => [r, r]) : []);
  setOptions($('hist-probe'), having('hist'));
  // Rank 0 alone records expert load (the step's global counts).
  setOptions($('expert-probe'), ctx.probes.filter(p => reductionsOf(p).includes('experts')).map(p => [p.id, p.point]));
  setOptions($('heat-probe'), having('raw'));
  setOptions($('attn-probe'), having('attn'));
  const ap = probeById($('attn-probe').value);
  setOptions($('attn-head'), [...Array(ap ? ap.attrs.heads || 1 : 0).keys()].map(h => [h, `head ${h}`]));
}

function latestSampledStep(steps, red) {
  const sk = ctx.probes.filter(p => onRank(p) && reductionsOf(p).includes(red));
  if (!sk.length || !steps.length) return 0;
  const every = Math.max(...sk.map(p => p.every || 1));
  const last = Math.max(...steps.map(s => s.step));
  return last - (last % every);
}

async function refresh() {
  try {
    await loadRuns();
    if (ctx.run === null) { $('status').textContent = 'no runs in this database'; return; }
    await loadRanksAndProbes();
    const steps = await drawTraining(ctx);
    const pcaPhase = $('pca-phase').value;
    await Promise.all([
      drawStats(ctx, $('stat-probe').value, $('stat-red').value),
      drawHist(ctx, probeById($('hist-probe').value)),
      drawExperts(ctx, probeById($('expert-probe').value)),
      drawHeatmap(ctx, probeById($('heat-probe').value), $('heat-phase').value),
      drawAttention(ctx, probeById($('attn-probe').value), Number($('attn-head').value || 0), $('attn-phase').value),
      drawLens(ctx, Number($('lens-step').value || 0), $('lens-phase').value),
      drawPca(ctx, pcaPhase === 'train' ? latestSampledStep(steps, 'sketch') : 0, pcaPhase),
      drawGeneration(ctx), drawPatches(), drawSwitches(ctx),
    ]);
    $('status').textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = '1';
  } catch (e) {
    $('status').textContent = `error: ${e.message}`;
  }
}

for (const id of ['run', 'rank', 'stat-probe', 'stat-red', 'hist-probe', 'expert-probe', 'heat-probe', 'heat-phase',
  'attn-probe', 'attn-head', 'attn-phase', 'lens-phase', 'lens-step', 'pca-phase'])
  $(id).addEventListener('change', refresh);
wirePatchForm();
refresh();
setInterval(refresh, 2000);
