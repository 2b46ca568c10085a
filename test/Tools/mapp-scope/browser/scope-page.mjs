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
  await page.waitForFunction(() =>
    Number(document.getElementById('attn-canvas').dataset.rendered || 0) > 0 &&
    document.querySelectorAll('#pca-plot circle').length > 0 &&
    document.querySelectorAll('#hist-plot rect').length > 0, null, { timeout: 30000 });
  Object.assign(result, await page.evaluate(() => {
    const pts = sel => (document.querySelector(sel)?.getAttribute('points') || '')
      .split(' ').filter(Boolean).length;
    return {
      lossPoints: pts('#loss-plot polyline'),
      statPoints: pts('#stat-plot polyline'),
      histBars: document.querySelectorAll('#hist-plot rect').length,
      pcaPoints: document.querySelectorAll('#pca-plot circle').length,
      heatCells: Number(document.getElementById('attn-canvas').dataset.rendered),
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
