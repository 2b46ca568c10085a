// Every view of the Vite/ECharts page in Debian's headless Chromium: picks
// runs, ranks, probes; hovers chart cells and reads the tooltips; runs a
// patch from the form; screenshots each view. Prints one JSON object that
// test_scope_ui.py compares with the store.
//   node scope-views.mjs URL SHOTDIR
import { chromium } from 'playwright-core';

const [url, shots] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const out = { errors: [] };
const page = await browser.newPage({ viewport: { width: 1500, height: 1000 } });
page.on('pageerror', e => out.errors.push(String(e)));
page.on('response', r => { if (r.status() >= 400 && !r.url().includes('/api/patch')) out.errors.push(`${r.status()} ${r.url()}`); });
// The one refused request is the malformed patch below (a 400 by design).
page.on('console', m => {
  if ((m.type() === 'error' || m.type() === 'warning') && !m.text().includes('status of 400')) out.errors.push(m.text());
});

const settle = () => page.waitForTimeout(2600); // one poll (2 s) plus a redraw
async function pick(sel, label) {
  const value = await page.$eval(sel, (s, l) => [...s.options].find(o => o.textContent === l || o.textContent.includes(l))?.value, label);
  if (value === undefined) throw new Error(`${sel} has no option '${label}'`);
  await page.selectOption(sel, value);
  await settle();
}
const options = sel => page.$eval(sel, s => [...s.options].map(o => o.textContent));
const count = id => page.$eval(`#${id}`, e => Number(e.dataset.count || -1));
// Moves the mouse onto data point `value` of series `si` and returns the
// tooltip's text.
async function hover(id, value, si = 0, dataIndex = undefined) {
  await page.mouse.move(0, 0);
  await page.waitForTimeout(150);
  const [x, y] = await page.evaluate(([id, v, si]) => {
    const c = window.megascope.charts[id];
    const [px, py] = c.convertToPixel({ seriesIndex: si }, v);
    const r = document.getElementById(id).getBoundingClientRect();
    return [r.left + px, r.top + py];
  }, [id, value, si]);
  await page.mouse.move(x, y, { steps: 3 });
  let tip;
  try {
    tip = await page.waitForSelector(`#${id} .scope-tip`, { state: 'visible', timeout: 3000 });
  } catch (e) {
    // A point under another's symbol or label: ask ECharts for the same
    // tooltip at that data index.
    if (dataIndex === undefined) throw e;
    await page.evaluate(([id, si, di]) => window.megascope.charts[id].dispatchAction(
      { type: 'showTip', seriesIndex: si, dataIndex: di }), [id, si, dataIndex]);
    tip = await page.waitForSelector(`#${id} .scope-tip`, { state: 'visible', timeout: 3000 });
  }
  await page.waitForTimeout(150);
  return tip.innerText();
}
const axisLabels = (id, axis) => page.evaluate(([id, axis]) =>
  window.megascope.charts[id].getOption()[axis][0].data, [id, axis]);
const shot = async (section, name) => {
  await page.mouse.move(0, 0);
  await (await page.$(`#${section}`)).screenshot({ path: `${shots}/megascope-${name}.png` });
};

try {
  await page.goto(url);
  await page.waitForSelector('body[data-ready="1"]', { timeout: 30000 });
  out.csp = (await (await page.request.get(new URL('/', url).href)).headers())['content-security-policy'];

  // --- the training run (run 1): series, heatmap, attention, PCA, histogram
  await pick('#run', 'train');
  out.runs = await options('#run');
  out.lossCount = await count('loss-chart');
  out.lossTip = await hover('loss-chart', [2, await page.evaluate(() =>
    window.megascope.charts['loss-chart'].getOption().series[0].data.find(p => p[0] === 2)[1])]);
  await pick('#stat-probe', 'layers.0.mlp.fc1');
  await pick('#stat-red', 'mean');
  out.statCount = await count('stat-chart');
  const sd = await page.evaluate(() => window.megascope.charts['stat-chart'].getOption().series[0].data);
  out.statTip = await hover('stat-chart', sd[1]);
  await page.evaluate(() => window.megascope.charts['stat-chart'].dispatchAction({ type: 'dataZoom', start: 50, end: 100 }));
  await page.waitForTimeout(300);
  out.statZoom = await page.evaluate(() => window.megascope.charts['stat-chart'].getModel()
    .getComponent('xAxis').axis.scale.getExtent());
  await shot('stats', 'stats');
  await shot('training', 'training');

  await pick('#heat-probe', 'layers.0.mlp.fc1');
  out.heatY = await axisLabels('heat-chart', 'yAxis');
  out.heatCount = await count('heat-chart');
  out.heatTip = await hover('heat-chart', [3, 2], 0, 2 * 64 + 3);
  await shot('heatmap', 'heatmap');

  await pick('#attn-probe', 'layers.0.attn.probs');
  await pick('#attn-head', 'head 1');
  out.attnInfo = await page.textContent('#attn-info');
  out.attnX = await axisLabels('attn-chart', 'xAxis');
  out.attnTip = await hover('attn-chart', [1, 5], 0, 5 * 8 + 1);
  await shot('attention', 'attention');

  out.pcaCount = await count('pca-chart');
  out.pcaInfo = await page.textContent('#pca-info');
  const pd = await page.evaluate(() => window.megascope.charts['pca-chart'].getOption().series[0].data[3]);
  out.pcaPoint = pd;
  out.pcaTip = await hover('pca-chart', pd.slice(0, 2), 0, 3);
  await shot('pca', 'pca');
  out.histCount = await count('hist-chart');
  await shot('hist', 'histogram');
  out.switches = await page.$$eval('#switches input[type=checkbox]', e => e.length);

  // --- the generation run (run 2): lens, generated tokens, decode attention
  await pick('#run', 'generate');
  await page.fill('#lens-step', '0');
  await page.dispatchEvent('#lens-step', 'change');
  await settle();
  out.lensInfo = await page.textContent('#lens-info');
  out.lensX = await axisLabels('lens-chart', 'xAxis');
  out.lensY = await axisLabels('lens-chart', 'yAxis');
  out.lensTip = await hover('lens-chart', [4, 1], 0, 1 * 8 + 4);
  await shot('lens', 'lens');
  out.genTokens = await page.$$eval('#gen-tokens span', s => s.map(e => e.textContent));
  await page.click('#gen-tokens span:nth-child(2)');
  await settle();
  out.genTopk = await page.$$eval('#gen-topk tbody tr', rows => rows.map(r => [...r.cells].map(c => c.textContent)));
  await shot('generation', 'generation');
  await pick('#attn-probe', 'layers.1.attn.probs');
  out.genAttnInfo = await page.textContent('#attn-info');
  out.genAttnY = await axisLabels('attn-chart', 'yAxis');

  // --- activation patching from the form (parameters only)
  await page.fill('#patch-into', 'The cat');
  await page.fill('#patch-from', 'A dog r');
  await page.selectOption('#patch-site', 'attn');
  await page.fill('#patch-layer', '1');
  await page.fill('#patch-pos', '6');
  await page.fill('#patch-target', 'a');
  await page.click('#patch-run');
  await page.waitForSelector('#patch-results tbody tr', { timeout: 60000 });
  out.patchRow = await page.$$eval('#patch-results tbody tr td', t => t.map(e => e.textContent));
  out.patchStatus = await page.textContent('#patch-status');
  // A malformed request (from a script, not the form) is refused by name.
  out.patchBad = await page.evaluate(async () => (await fetch('/api/patch', { method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ into: 'a', from: 'b', site: 'x;rm -rf', layer: 0, pos: 0, target: 'a' }) })).json());
  await page.waitForTimeout(300);
  await shot('patch', 'patch');

  // --- the tp=2 pp=2 run (run 3): every rank selectable
  await pick('#run', 'tp2pp2');
  out.rankOptions = await options('#rank');
  await pick('#stat-probe', 'layers.1.mlp.fc1');
  out.ppStatSeries = await page.evaluate(() => window.megascope.charts['stat-chart'].getOption().series.map(s => s.name));
  await pick('#rank', 'rank 3');
  out.rank3AttnProbes = await options('#attn-probe');
  out.rank3AttnInfo = await page.textContent('#attn-info');
  out.rank3AttnTip = await hover('attn-chart', [2, 4], 0, 4 * 8 + 2);
  await shot('attention', 'ranks');
  await page.mouse.move(0, 0);
  await page.screenshot({ path: `${shots}/megascope-page.png`, fullPage: true });
} catch (e) {
  out.errors.push(String(e && e.stack || e));
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
