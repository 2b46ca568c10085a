// ECharts, only the parts the views use (tree-shaken by Vite). Every chart
// is kept in a registry by its element id so redraws reuse the instance,
// and browser tests can find its pixels (window.megascope.charts).
import * as echarts from 'echarts/core';
import { BarChart, HeatmapChart, LineChart, ScatterChart } from 'echarts/charts';
import {
  DataZoomComponent, GridComponent, LegendComponent, TitleComponent,
  TooltipComponent, VisualMapComponent,
} from 'echarts/components';
import { CanvasRenderer } from 'echarts/renderers';

echarts.use([BarChart, HeatmapChart, LineChart, ScatterChart, DataZoomComponent,
  GridComponent, LegendComponent, TitleComponent, TooltipComponent,
  VisualMapComponent, CanvasRenderer]);

const charts = {};
window.megascope = { charts };

export function chart(id) {
  if (!charts[id]) {
    charts[id] = echarts.init(document.getElementById(id), null, { renderer: 'canvas' });
    window.addEventListener('resize', () => charts[id].resize());
  }
  return charts[id];
}

// A tooltip whose formatter returns escaped HTML (api.js esc), in a styled
// class of ours: no inline style attributes (the page's CSP forbids them).
export const tooltip = (formatter, trigger = 'item') => ({
  trigger, formatter, className: 'scope-tip', confine: true,
  textStyle: { fontFamily: 'monospace', fontSize: 12 },
});

// Drawn only when the option changed: polling redraws nothing otherwise.
const shown = {};
export function draw(id, option) {
  const key = JSON.stringify(option, (k, v) => (typeof v === 'function' ? String(v) : v));
  if (shown[id] === key) return false;
  shown[id] = key;
  chart(id).setOption(option, { notMerge: true });
  document.getElementById(id).dataset.drawn = String(Date.now());
  return true;
}

export function clear(id) {
  delete shown[id];
  if (charts[id]) charts[id].clear();
}
