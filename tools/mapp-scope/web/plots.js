// Small SVG/canvas plots built with DOM calls only: data from the store is
// never parsed as markup, so a token text cannot inject anything.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const W = 420, H = 220, PAD = 36;

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function frame(container) {
  container.replaceChildren();
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none' });
  container.appendChild(svg);
  return svg;
}

function extent(vals) {
  let lo = Infinity, hi = -Infinity;
  for (const v of vals) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (!Number.isFinite(lo)) return [0, 1];
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  return [lo, hi];
}

function fmt(v) {
  const a = Math.abs(v);
  return (a !== 0 && (a < 1e-3 || a >= 1e4)) ? v.toExponential(2) : v.toPrecision(3);
}

function axes(svg, xr, yr) {
  svg.appendChild(el('line', { class: 'axis', x1: PAD, y1: H - PAD, x2: W - 8, y2: H - PAD }));
  svg.appendChild(el('line', { class: 'axis', x1: PAD, y1: 8, x2: PAD, y2: H - PAD }));
  svg.appendChild(el('text', { class: 'tick', x: PAD, y: H - PAD + 14 }, fmt(xr[0])));
  svg.appendChild(el('text', { class: 'tick', x: W - 40, y: H - PAD + 14 }, fmt(xr[1])));
  svg.appendChild(el('text', { class: 'tick', x: 2, y: H - PAD }, fmt(yr[0])));
  svg.appendChild(el('text', { class: 'tick', x: 2, y: 16 }, fmt(yr[1])));
}

// series: [{label, points: [[x, y], ...]}]
function linePlot(container, series) {
  const svg = frame(container);
  const xs = [], ys = [];
  for (const s of series) for (const [x, y] of s.points) { xs.push(x); ys.push(y); }
  const xr = extent(xs), yr = extent(ys);
  axes(svg, xr, yr);
  const sx = x => PAD + (x - xr[0]) / (xr[1] - xr[0]) * (W - PAD - 8);
  const sy = y => H - PAD - (y - yr[0]) / (yr[1] - yr[0]) * (H - PAD - 8);
  series.forEach((s, i) => {
    const pts = s.points.filter(([x, y]) => Number.isFinite(y))
      .map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(' ');
    svg.appendChild(el('polyline', { class: `line r${i % 4}`, points: pts, 'data-label': s.label }));
  });
  return svg;
}

function barPlot(container, values, lo, hi) {
  const svg = frame(container);
  const yr = [0, Math.max(1, ...values)];
  axes(svg, [lo, hi], yr);
  const bw = (W - PAD - 8) / Math.max(values.length, 1);
  values.forEach((v, i) => {
    const h = v / yr[1] * (H - PAD - 8);
    svg.appendChild(el('rect', { class: 'bar', x: PAD + i * bw, y: H - PAD - h,
      width: Math.max(bw - 1, 1), height: h }));
  });
  return svg;
}

function scatterPlot(container, points, colorOf) {
  const svg = frame(container);
  const xr = extent(points.map(p => p.x)), yr = extent(points.map(p => p.y));
  axes(svg, xr, yr);
  const sx = x => PAD + (x - xr[0]) / (xr[1] - xr[0]) * (W - PAD - 8);
  const sy = y => H - PAD - (y - yr[0]) / (yr[1] - yr[0]) * (H - PAD - 8);
  for (const p of points) {
    const c = el('circle', { cx: sx(p.x), cy: sy(p.y), r: 3, fill: colorOf(p) });
    c.appendChild(el('title', {}, p.point));
    svg.appendChild(c);
  }
  return svg;
}

// probs: rows x cols values in [0, 1], drawn as a heatmap on a canvas.
function heatmap(canvas, probs, rows, cols) {
  const ctx = canvas.getContext('2d');
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const cw = canvas.width / cols, ch = canvas.height / rows;
  let max = 0;
  for (const v of probs) max = Math.max(max, v);
  for (let r = 0; r < rows; ++r)
    for (let c = 0; c < cols; ++c) {
      const v = max > 0 ? probs[r * cols + c] / max : 0;
      const shade = Math.round(255 * (1 - v));
      ctx.fillStyle = `rgb(${shade},${shade},255)`;
      ctx.fillRect(c * cw, r * ch, Math.ceil(cw), Math.ceil(ch));
    }
  canvas.dataset.rendered = String(rows * cols);
}

window.MegaPlots = { linePlot, barPlot, scatterPlot, heatmap };
