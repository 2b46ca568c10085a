// Loads the mapp-scope page in Debian's headless Chromium, checks that the
// views render from the store, flips perturbation switch 0 and waits until
// the running job's control log shows it. Prints one JSON object.
//   node scope-page.mjs URL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [url, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
    '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const result = { errors: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
  page.on('pageerror', e => result.errors.push(String(e)));
  page.on('console', m => { if (m.type() === 'error') result.errors.push(m.text()); });
  await page.goto(url);
  await page.waitForSelector('body[data-ready="1"]', { timeout: 30000 });
  // Each chart says how many items it drew (data-count, main.js).
  await page.waitForFunction(() => ['attn-chart', 'pca-chart', 'hist-chart', 'stat-chart']
    .every(id => Number(document.getElementById(id).dataset.count || 0) > 0), null, { timeout: 30000 });
  Object.assign(result, await page.evaluate(() => {
    const n = id => Number(document.getElementById(id).dataset.count || 0);
    return {
      lossPoints: n('loss-chart'),
      statPoints: n('stat-chart'),
      histBars: n('hist-chart'),
      pcaPoints: n('pca-chart'),
      heatCells: n('attn-chart'),
      switches: document.querySelectorAll('#switches input[type=checkbox]').length,
      switchOn: document.getElementById('switch-0')?.checked,
    };
  }));
  await page.fill('#mag-0', '0.75');
  await page.click('#switch-0');
  await page.waitForFunction(() =>
    document.querySelectorAll('#control-log tbody tr').length > 0, null, { timeout: 30000 });
  result.controlStatus = await page.textContent('#control-status');
  result.controlRow = await page.evaluate(() =>
    [...document.querySelectorAll('#control-log tbody tr td')].map(td => td.textContent));
  await page.screenshot({ path: shot, fullPage: true });
} catch (e) {
  result.errors.push(String(e));
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
