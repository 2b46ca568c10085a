// The expert-load view of the mapp-scope page in Debian's headless Chromium:
// picks each MoE layer and reads what the bar chart and the imbalance line
// drew (test_scope_experts.py compares them with metrics.jsonl). Prints one
// JSON object.
//   node scope-experts.mjs URL
import { chromium } from 'playwright-core';

const [url] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const out = { errors: [], layers: {} };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on('pageerror', e => out.errors.push(String(e)));
  page.on('console', m => { if (m.type() === 'error') out.errors.push(m.text()); });
  await page.goto(url);
  await page.waitForSelector('body[data-ready="1"]', { timeout: 30000 });
  const layers = await page.$eval('#expert-probe', s => [...s.options].map(o => [o.value, o.textContent]));
  for (const [value, name] of layers) {
    await page.selectOption('#expert-probe', value);
    // drawExperts marks the chart with the probe it drew.
    await page.waitForFunction(v => document.getElementById('expert-chart').dataset.probe === v,
      value, { timeout: 30000 });
    out.layers[name] = await page.evaluate(() => {
      const opt = id => window.megascope.charts[id].getOption();
      return {
        info: document.getElementById('expert-info').textContent,
        bars: opt('expert-chart').series[0].data,
        imbalance: opt('expert-imb-chart').series[0].data,
      };
    });
  }
} catch (e) {
  out.errors.push(String(e));
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
