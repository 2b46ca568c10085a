// The typed JSON API of mapp-scope. The page got its access token as an
// HttpOnly cookie (mapp-scope answered /?token=... with Set-Cookie), so
// fetch sends it on every same-origin call; nothing here sees the token.
export async function api(path) {
  const r = await fetch(path, { cache: 'no-store', credentials: 'same-origin' });
  if (!r.ok) {
    let msg = `${r.status}`;
    try { msg = (await r.json()).error || msg; } catch { /* not JSON */ }
    throw new Error(`${path}: ${msg}`);
  }
  return r.json();
}

export async function post(path, body) {
  const r = await fetch(path, {
    method: 'POST', credentials: 'same-origin', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' },
  });
  let reply = {};
  try { reply = await r.json(); } catch { /* not JSON */ }
  if (!r.ok && !reply.error) reply.error = `HTTP ${r.status}`;
  return reply;
}

export const qs = params => Object.entries(params)
  .filter(([, v]) => v !== undefined && v !== null && v !== '')
  .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('&');

// A token's text made visible: spaces, newlines, tabs and control bytes
// get a glyph; no text (no vocabulary in the store) shows the id.
export function tokenLabel(text, id) {
  if (text === null || text === undefined) return `#${id}`;
  if (text === '') return '∅';
  // A byte that is not UTF-8 by itself (bytes tokenizer, BPE pieces).
  if (/^\uFFFD+$/.test(text)) return `⟨#${id}⟩`;
  return text.replace(/ /g, '␣').replace(/\n/g, '⏎').replace(/\t/g, '⇥')
    .replace(/[\u0000-\u001f\u007f]/g, '·');
}

// Tooltips are HTML: every store-derived string goes through this.
export function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({
    '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
  })[c]);
}

export function num(v, digits = 6) {
  if (v === null || v === undefined || Number.isNaN(v)) return 'n/a';
  const a = Math.abs(v);
  return (a !== 0 && (a < 1e-4 || a >= 1e6)) ? v.toExponential(digits - 1) : v.toPrecision(digits);
}
