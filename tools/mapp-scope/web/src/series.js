// Views over steps: training loss and per-probe statistics (one line per
// rank, zoom by drag/scroll and a slider), the latest histogram, and an MoE
// layer's expert load.
import { api, esc, num, qs } from './api.js';
import { draw, tooltip } from './charts.js';

const zoom = [{ type: 'inside', xAxisIndex: 0 }, { type: 'slider', xAxisIndex: 0, height: 18, bottom: 4 }];

function byRank(rows, valueOf) {
  const m = new Map();
  for (const r of rows) {
    const v = valueOf(r);
    if (v === null || v === undefined) continue;
    if (!m.has(r.rank)) m.set(r.rank, []);
    m.get(r.rank).push([r.step, v]);
  }
  return [...m].sort((a, b) => a[0] - b[0]);
}

function lineOption(series, yName, rankLabel) {
  return {
    animation: false,
    grid: { left: 60, right: 20, top: 30, bottom: 56 },
    legend: { top: 0, type: 'scroll' },
    tooltip: tooltip(ps => ps.map(p =>
      `${esc(p.seriesName)} step <b>${p.value[0]}</b>: ${num(p.value[1])}`).join('<br>'), 'axis'),
    xAxis: { type: 'value', name: 'step', nameLocation: 'middle', nameGap: 22, minInterval: 1 },
    yAxis: { type: 'value', name: yName, scale: true },
    dataZoom: zoom,
    series: series.map(([rank, points]) => ({
      name: rankLabel(rank), type: 'line', showSymbol: points.length < 60,
      symbolSize: 4, data: points,
    })),
  };
}

export async function drawTraining(ctx) {
  const steps = await api(`/api/steps?${qs({ run: ctx.run })}`);
  const s = byRank(steps, r => r.loss);
  ctx.setCount('loss-chart', s.reduce((n, [, p]) => n + p.length, 0));
  draw('loss-chart', lineOption(s, 'loss', ctx.rankLabel));
  return steps;
}

export async function drawStats(ctx, probe, red) {
  if (!probe || !red) return;
  const rows = await api(`/api/series?${qs({ run: ctx.run, probe, reduction: red })}`);
  const s = byRank(rows, r => r.value);
  ctx.setCount('stat-chart', s.reduce((n, [, p]) => n + p.length, 0));
  draw('stat-chart', lineOption(s, red, ctx.rankLabel));
}

export async function drawHist(ctx, probe) {
  if (!probe) return;
  const s = await api(`/api/sample?${qs({ run: ctx.run, probe: probe.id, reduction: 'hist', rank: ctx.rank })}`);
  if (!s) { document.getElementById('hist-info').textContent = 'no samples on this rank'; return; }
  const { lo, hi } = probe.attrs, n = s.data.length, w = (hi - lo) / n;
  document.getElementById('hist-info').textContent = `step ${s.step}, ${n} bins in [${lo}, ${hi}]`;
  ctx.setCount('hist-chart', n);
  draw('hist-chart', {
    animation: false,
    grid: { left: 50, right: 20, top: 20, bottom: 40 },
    tooltip: tooltip(p => `[${num(lo + p.dataIndex * w, 4)}, ${num(lo + (p.dataIndex + 1) * w, 4)}): <b>${p.value}</b>`),
    xAxis: { type: 'category', data: s.data.map((_, i) => num(lo + (i + 0.5) * w, 3)) },
    yAxis: { type: 'value', name: 'count' },
    series: [{ type: 'bar', data: s.data, barCategoryGap: '5%' }],
  });
}

// Tokens per expert of one MoE layer: the latest step's rows as bars, and
// the load imbalance (busiest expert over the mean, 1 = even) over steps.
// Rank 0 records the step's global counts (as metrics.jsonl).
export async function drawExperts(ctx, probe) {
  const info = document.getElementById('expert-info');
  if (!probe) { info.textContent = 'no MoE layers in this run'; return; }
  const [rows, s] = await Promise.all([
    api(`/api/series?${qs({ run: ctx.run, probe: probe.id, reduction: 'experts' })}`),
    api(`/api/sample?${qs({ run: ctx.run, probe: probe.id, reduction: 'experts', rank: 0 })}`),
  ]);
  if (!s) { info.textContent = 'no samples yet'; return; }
  const total = s.data.reduce((a, b) => a + b, 0);
  info.textContent = `step ${s.step}: ${total} rows over ${s.data.length} experts, ` +
    `busiest ${Math.max(...s.data)} (${num(s.value)}× the mean)`;
  ctx.setCount('expert-chart', s.data.length);
  draw('expert-chart', {
    animation: false,
    grid: { left: 50, right: 20, top: 20, bottom: 40 },
    tooltip: tooltip(p => `expert ${p.dataIndex}: <b>${p.value}</b> rows (${num(100 * p.value / total, 3)}%)`),
    xAxis: { type: 'category', name: 'expert', nameLocation: 'middle', nameGap: 26, data: s.data.map((_, i) => String(i)) },
    yAxis: { type: 'value', name: 'rows' },
    series: [{ type: 'bar', data: s.data }],
  });
  const series = byRank(rows, r => r.value);
  ctx.setCount('expert-imb-chart', series.reduce((n, [, p]) => n + p.length, 0));
  draw('expert-imb-chart', lineOption(series, 'max / mean', ctx.rankLabel));
  document.getElementById('expert-chart').dataset.probe = String(probe.id); // for tests
}
