// Token-labelled views: activations by token, attention by layer and head,
// the logit lens grid and the PCA scatter. Axis labels and hover texts come
// from the store's `contexts` and `vocab` (/api/tokens, /api/lens).
import { api, esc, num, qs, tokenLabel } from './api.js';
import { draw, tooltip } from './charts.js';

const $ = id => document.getElementById(id);

export async function tokensOf(ctx, step, phase) {
  const t = await api(`/api/tokens?${qs({ run: ctx.run, step, phase, rank: ctx.rank })}`);
  return t ? t.tokens : [];
}

// Position i's label: the token text, or "pos i" where no token is known
// (padding past a generation's context, a store without contexts).
const labelAt = (toks, i) => (toks[i] ? tokenLabel(toks[i].text, toks[i].id) : `pos ${i}`);

function heatOption({ xs, ys, cells, min, max, tip, xName, yName, colors, labelOf }) {
  return {
    animation: false,
    grid: { left: 90, right: 70, top: 10, bottom: 70 },
    tooltip: tooltip(tip),
    xAxis: { type: 'category', data: xs, name: xName, nameLocation: 'middle', nameGap: 50,
      axisLabel: { interval: 0, rotate: xs.length > 12 ? 60 : 0, fontFamily: 'monospace', hideOverlap: true } },
    yAxis: { type: 'category', data: ys, name: yName, inverse: true,
      axisLabel: { interval: 0, fontFamily: 'monospace', hideOverlap: true } },
    visualMap: { min, max, precision: 3, calculable: true, orient: 'vertical', right: 0, top: 'center',
      inRange: { color: colors || ['#f7fbff', '#6baed6', '#08306b'] } },
    series: [{ type: 'heatmap', data: cells, progressive: 0,
      label: labelOf ? { show: true, formatter: labelOf, fontFamily: 'monospace', fontSize: 10 } : { show: false } }],
  };
}

function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return Number.isFinite(lo) ? (lo === hi ? [lo - 1, hi + 1] : [lo, hi]) : [0, 1];
}

export async function drawHeatmap(ctx, probe, phase) {
  if (!probe) return;
  const s = await api(`/api/sample?${qs({ run: ctx.run, probe: probe.id, reduction: 'raw', phase, rank: ctx.rank })}`);
  if (!s) { $('heat-info').textContent = 'no raw samples on this rank'; return; }
  // The last two dimensions are [tokens, channels]; batch row 0 is shown.
  const shape = s.shape.length >= 2 ? s.shape : (Array.isArray(probe.shape) && probe.shape.length ? probe.shape : [1, s.data.length]), C = shape[shape.length - 1], T = shape.length >= 2 ? shape[shape.length - 2] : 1;
  const toks = await tokensOf(ctx, s.step, phase);
  const cells = [];
  for (let t = 0; t < T; ++t) for (let c = 0; c < C; ++c) cells.push([c, t, s.data[t * C + c]]);
  const ys = [...Array(T).keys()].map(t => labelAt(toks, t));
  $('heat-info').textContent = `${probe.point}, ${phase} step ${s.step}: ${T} tokens x ${C} channels`;
  ctx.setCount('heat-chart', cells.length);
  const [lo, hi] = extent(cells.map(c => c[2])), m = Math.max(Math.abs(lo), Math.abs(hi));
  draw('heat-chart', heatOption({
    xs: [...Array(C).keys()].map(String), ys, cells, min: -m, max: m, xName: 'channel',
    colors: ['#2166ac', '#f7f7f7', '#b2182b'],
    tip: p => `token <b>${esc(ys[p.value[1]])}</b> (pos ${p.value[1]})<br>channel ${p.value[0]}: <b>${num(p.value[2])}</b>`,
  }));
}

export async function drawAttention(ctx, probe, head, phase) {
  if (!probe) return;
  const s = await api(`/api/sample?${qs({ run: ctx.run, probe: probe.id, reduction: 'attn', phase, rank: ctx.rank })}`);
  if (!s) { $('attn-info').textContent = 'no attention samples on this rank'; return; }
  const [heads, rows, cols] = s.shape, h = Math.min(head, heads - 1);
  const toks = await tokensOf(ctx, s.step, phase);
  // A KV-cache decode step has one query row: the newest token, at the
  // last key position.
  const q0 = rows === 1 ? (toks.length ? toks.length - 1 : cols - 1) : 0;
  const xs = [...Array(cols).keys()].map(k => labelAt(toks, k));
  const ys = [...Array(rows).keys()].map(q => labelAt(toks, q0 + q));
  const cells = [];
  for (let q = 0; q < rows; ++q)
    for (let k = 0; k < cols; ++k) cells.push([k, q, s.data[(h * rows + q) * cols + k]]);
  $('attn-info').textContent = `${probe.point} head ${h}, ${phase} step ${s.step}`;
  ctx.setCount('attn-chart', cells.length);
  draw('attn-chart', heatOption({
    xs, ys, cells, min: 0, max: 1, xName: 'key token', yName: 'query',
    tip: p => `query <b>${esc(ys[p.value[1]])}</b> (pos ${q0 + p.value[1]})<br>` +
      `key <b>${esc(xs[p.value[0]])}</b> (pos ${p.value[0]})<br>p = <b>${num(p.value[2])}</b>`,
  }));
}

export async function drawLens(ctx, step, phase) {
  const layers = await api(`/api/lens?${qs({ run: ctx.run, step, phase, rank: ctx.rank })}`);
  if (!layers.length) { $('lens-info').textContent = `no lens samples at ${phase} step ${step} on this rank`; ctx.setCount('lens-chart', 0); return; }
  const toks = await tokensOf(ctx, step, phase);
  const positions = layers[0].rows.map(r => r.position);
  // A decode step's single row sits at the end of its context.
  // Selected positions may count from the end (-1 = last).
  const posOf = i => {
    if (layers[0].rows.length === 1 && toks.length > 1 && positions[0] === 0) return toks.length - 1;
    const p = positions[i];
    return p < 0 ? toks.length + p : p;
  };
  const xs = positions.map((_, i) => labelAt(toks, posOf(i)));
  const ys = layers.map(l => l.point);
  const cells = [], cellTop = {};
  layers.forEach((l, y) => l.rows.forEach((r, x) => {
    cells.push([x, y, r.top[0] ? r.top[0].p : 0]);
    cellTop[`${x},${y}`] = r.top;
  }));
  $('lens-info').textContent = `${phase} step ${step}: ${ys.length} layers x ${xs.length} positions, top ${layers[0].rows[0]?.top.length || 0}`;
  ctx.setCount('lens-chart', cells.length);
  draw('lens-chart', heatOption({
    // Scaled to the largest top-1 probability: an early model's are small.
    xs, ys, cells, min: 0, max: Math.max(...cells.map(c => c[2]), 1e-6), xName: 'input token', yName: 'layer',
    colors: ['#fff7ec', '#fdbb84', '#d7301f'],
    labelOf: p => { const t = cellTop[`${p.value[0]},${p.value[1]}`][0]; return t ? tokenLabel(t.text, t.id) : ''; },
    tip: p => {
      const top = cellTop[`${p.value[0]},${p.value[1]}`];
      return `${esc(ys[p.value[1]])}, pos ${posOf(p.value[0])} <b>${esc(xs[p.value[0]])}</b><br>` +
        top.map((t, i) => `${i + 1}. <b>${esc(tokenLabel(t.text, t.id))}</b> #${t.id} p=${num(t.p)}`).join('<br>');
    },
  }));
}

export async function drawPca(ctx, step, phase) {
  const r = await api(`/api/pca?${qs({ run: ctx.run, step, phase, rank: ctx.rank })}`);
  if (!r.points.length) { $('pca-info').textContent = `no sketches at ${phase} step ${step} on this rank`; ctx.setCount('pca-chart', 0); return; }
  const toks = await tokensOf(ctx, step, phase);
  const layers = [...new Set(r.points.map(p => p.point))];
  $('pca-info').textContent = `${phase} step ${step}: PC1 ${(100 * r.explained[0]).toFixed(1)}%, ` +
    `PC2 ${(100 * r.explained[1]).toFixed(1)}% of variance; ${r.points.length} rows`;
  ctx.setCount('pca-chart', r.points.length);
  const T = ctx.seqLength || toks.length || 1;
  // Row i of a sketch is batch row i / T, position i % T; the stored
  // context covers microbatch 0, so row i's token is toks[i].
  const tokOf = i => labelAt(toks, i < toks.length ? i : i % T);
  draw('pca-chart', {
    animation: false,
    grid: { left: 50, right: 20, top: 30, bottom: 40 },
    legend: { top: 0 },
    tooltip: tooltip(p => `${esc(p.seriesName)} row ${p.value[2]} (batch ${Math.floor(p.value[2] / T)}, pos ${p.value[2] % T})<br>` +
      `token <b>${esc(tokOf(p.value[2]))}</b><br>PC1 ${num(p.value[0])}, PC2 ${num(p.value[1])}`),
    xAxis: { type: 'value', name: 'PC1', scale: true },
    yAxis: { type: 'value', name: 'PC2', scale: true },
    dataZoom: [{ type: 'inside', xAxisIndex: 0 }, { type: 'inside', yAxisIndex: 0 }],
    series: layers.map(name => ({
      name, type: 'scatter', symbolSize: 7,
      data: r.points.filter(p => p.point === name).map(p => [p.x, p.y, p.row]),
      label: { show: true, position: 'right', fontFamily: 'monospace', fontSize: 10,
        formatter: p => tokOf(p.value[2]) },
      labelLayout: { hideOverlap: true },
    })),
  });
}
