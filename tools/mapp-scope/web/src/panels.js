// Table and form views: generated tokens with their top-k, activation
// patching (parameters only: the server starts mapp-run --patch), and the
// live perturbation switches.
import { api, esc, num, post, qs, tokenLabel } from './api.js';
import { draw, tooltip } from './charts.js';

const $ = id => document.getElementById(id);

function cell(text, cls) {
  const td = document.createElement('td');
  td.textContent = String(text);
  if (cls) td.className = cls;
  return td;
}

export async function drawGeneration(ctx) {
  const toks = await api(`/api/generation?${qs({ run: ctx.run })}`);
  const box = $('gen-tokens');
  const sel = Math.min(Number(box.dataset.sel || 0), Math.max(toks.length - 1, 0));
  box.replaceChildren(...toks.map((t, i) => {
    const s = document.createElement('span');
    s.textContent = tokenLabel(t.text, t.token);
    s.title = `position ${t.position}, token #${t.token}, p=${num(t.prob)}`;
    s.dataset.position = String(t.position);
    if (i === sel) s.className = 'sel';
    s.addEventListener('click', () => { box.dataset.sel = String(i); drawGeneration(ctx); });
    return s;
  }));
  if (!toks.length) box.textContent = 'no generated tokens in this run';
  const t = toks[sel];
  $('gen-topk').tBodies[0].replaceChildren(...(t ? t.topk : []).map((k, i) => {
    const tr = document.createElement('tr');
    tr.append(cell(i + 1), cell(tokenLabel(k.text, k.id)), cell(k.id, 'num'), cell(num(k.p), 'num'));
    if (k.id === t.token) tr.className = 'sel';
    return tr;
  }));
}

export async function drawPatches() {
  const r = await api('/api/patches');
  $('patch-run').disabled = !r.enabled;
  if (!r.enabled)
    $('patch-status').textContent = 'patching from the page is off: start mapp-scope serve with --patch-plan PLAN --patch-weights W';
  $('patch-results').tBodies[0].replaceChildren(...r.results.map(x => {
    const tr = document.createElement('tr');
    tr.append(cell(x.site), cell(x.layer, 'num'), cell(x.pos, 'num'),
      cell(`${tokenLabel(x.target_text)} #${x.target}`), cell(num(x.clean_logit), 'num'),
      cell(num(x.patched_logit), 'num'), cell(num(x.delta), 'num'));
    return tr;
  }));
  const names = r.results.map((x, i) => `${i + 1}: ${x.site} L${x.layer} p${x.pos}`);
  draw('patch-chart', {
    animation: false,
    grid: { left: 60, right: 20, top: 10, bottom: 30 },
    tooltip: tooltip(p => {
      const x = r.results[p.dataIndex];
      return `${esc(x.site)} layer ${x.layer} pos ${x.pos} → target <b>${esc(tokenLabel(x.target_text))}</b><br>` +
        `A ${esc(JSON.stringify(x.into))} ← B ${esc(JSON.stringify(x.from))}<br>` +
        `clean ${num(x.clean_logit)} → patched ${num(x.patched_logit)} (Δ <b>${num(x.delta)}</b>)`;
    }),
    xAxis: { type: 'category', data: names },
    yAxis: { type: 'value', name: 'Δ logit' },
    series: [{ type: 'bar', data: r.results.map(x => x.delta) }],
  });
}

export function wirePatchForm() {
  $('patch-form').addEventListener('submit', async ev => {
    ev.preventDefault();
    const body = {
      into: $('patch-into').value, from: $('patch-from').value, site: $('patch-site').value,
      layer: Number($('patch-layer').value), pos: Number($('patch-pos').value),
      target: $('patch-target').value,
    };
    $('patch-status').textContent = 'running…';
    $('patch-run').disabled = true;
    const reply = await post('/api/patch', body);
    $('patch-status').textContent = reply.error ? `refused: ${reply.error}` :
      `Δ logit of ${tokenLabel(body.target)}: ${num(reply.delta)} (clean ${num(reply.clean_logit)}, patched ${num(reply.patched_logit)})`;
    $('patch-status').className = reply.error ? 'error' : 'muted';
    await drawPatches();
  });
}

async function sendControl(ctx, id, enabled, magnitude) {
  const reply = await post('/api/control', { run: ctx.run, switch: id, enabled, magnitude });
  $('control-status').textContent = reply.ok ? `switch ${id}: sent` : `switch ${id}: ${reply.error || 'refused'}`;
}

let switchesShown = '';
export async function drawSwitches(ctx) {
  const s = await api(`/api/switches?${qs({ run: ctx.run })}`);
  const key = JSON.stringify([ctx.run, s.switches.map(x => x.id)]);
  if (key !== switchesShown) {
    switchesShown = key;
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
      on.addEventListener('change', () => sendControl(ctx, sw.id, on.checked, Number(mag.value)));
      apply.addEventListener('click', () => sendControl(ctx, sw.id, on.checked, Number(mag.value)));
      row.append(on, label, mag, apply);
      return row;
    }));
    if (!s.switches.length) $('switches').textContent = 'no perturbation switches in this run';
  }
  $('control-log').tBodies[0].replaceChildren(...s.log.map(e => {
    const tr = document.createElement('tr');
    for (const v of [e.step, e.switch, e.enabled ? 'on' : 'off', e.magnitude, e.source]) tr.appendChild(cell(v));
    return tr;
  }));
}
