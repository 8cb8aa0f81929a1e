// The sluice dashboard. It talks only to the server it was loaded from:
// GET /ui/api/state every two seconds, POST /ui/api/simulate from the
// playground. No subject ever reaches it.
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const OUTCOMES = ['allowed', 'denied', 'unavailable', 'indeterminate', 'incompatible'];
const POLL_MS = 2000;

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function showError(sel, msg) {
  const p = $(sel);
  p.textContent = msg || '';
  p.hidden = !msg;
}

// sum of a policy's decisions with the given outcomes over the span.
function total(series, outcomes) {
  let n = 0;
  for (const o of outcomes) n += (series.total && series.total[o]) || 0;
  return n;
}

// lastSecond is the decisions of the last complete second.
function lastSecond(series) {
  let n = 0;
  for (const c of Object.values(series.counts || {})) n += c[c.length - 2] || 0;
  return n;
}

function renderHeader(st) {
  const c = st.config;
  $('#generation').textContent = c
    ? `generation ${c.generation}, loaded ${new Date(c.loaded_at).toLocaleString()}` +
      (c.last_reload && c.last_reload.result === 'failure' ? ' (last reload failed: ' + c.last_reload.error + ')' : '')
    : 'built in';
  const s = st.store;
  const dd = $('#store');
  dd.textContent = '';
  const parts = [s.type || 'store'];
  if (s.latency_ms !== undefined) parts.push(`${s.latency_ms.toFixed(2)} ms`);
  if (s.breaker) parts.push(`breaker ${s.breaker}`);
  dd.append(el('span', { class: s.ready && (!s.breaker || s.breaker === 'closed') ? 'ok' : 'bad', id: 'store-status' },
    s.ready ? 'reachable' : 'unreachable'), ' ' + parts.join(' · '));
  if (s.error) dd.append(el('span', { class: 'bad' }, ' ' + s.error));
  $('#updated').textContent = new Date(st.now * 1000).toLocaleTimeString();
  $('#live-minutes').textContent = String(Math.round(st.live_seconds / 60));
}

// shares spells a policy's priority classes, e.g. " · critical 100%, sheddable 50%".
function shares(priorities) {
  const classes = Object.keys(priorities || {}).sort();
  if (classes.length === 0) return '';
  return ' · ' + classes.map((c) => c + ' ' + priorities[c] + '%').join(', ');
}

// marks are an Envoy rule's badges beside its policy ID: what its numbers
// mean (a shadow rule's denials were answered OK).
function marks(p) {
  const out = [];
  const badge = (text, title) => out.push(' ', el('span', { class: 'mark', title }, text));
  if (p.shadow) badge('shadow', 'shadow_mode: decided and counted, always answered OK: its denials were not enforced');
  if (p.quota_mode) badge('quota mode', 'quota_mode: over the limit stops a request only when every quota_mode descriptor of it is over');
  if (p.replaces) badge('replaces ' + p.replaces.join(', '), 'applied instead of these rules when both match a request');
  if (p.replaced_by) badge('replaced by ' + p.replaced_by.join(', '), 'not applied when one of these rules matches the same request');
  return out;
}

function renderPolicies(st) {
  const live = new Map((st.live || []).map((s) => [s.policy, s]));
  const tbody = $('#policies tbody');
  const rows = st.policies.map((p) => {
    const s = live.get(p.id) || { counts: {}, total: {} };
    const num = (v, cls) => el('td', { class: 'num' + (cls ? ' ' + cls : '') }, String(v));
    return el('tr', { 'data-policy': p.id },
      el('td', {}, p.id, ...marks(p)),
      el('td', {}, p.algorithm + (p.approximate ? ' (approximate)' : '') + shares(p.priorities)),
      num(p.limit), el('td', {}, p.window), num(p.burst || ''), num(p.max_cost),
      el('td', {}, p.failure_mode), num(p.revision),
      num(lastSecond(s), 'rate'),
      num(total(s, ['allowed']), 'allowed'),
      num(total(s, ['denied']) + (p.shadow ? ' (answered OK)' : ''), 'denied'),
      num(total(s, ['unavailable', 'indeterminate', 'incompatible']), 'undecided'));
  });
  tbody.replaceChildren(...rows);
}

function renderOverrides(st) {
  const tbody = $('#overrides tbody');
  if (!st.overrides) {
    tbody.replaceChildren(el('tr', {}, el('td', { colspan: 6, class: 'bad' }, 'the store could not be read')));
    return;
  }
  if (st.overrides.length === 0) {
    tbody.replaceChildren(el('tr', {}, el('td', { colspan: 6, class: 'note' }, 'none')));
    return;
  }
  tbody.replaceChildren(...st.overrides.map((o) => el('tr', { 'data-policy': o.policy },
    el('td', {}, o.policy), el('td', {}, o.note || '(no note)'),
    el('td', { class: 'num' }, String(o.limit)), el('td', { class: 'num' }, o.burst ? String(o.burst) : ''),
    el('td', {}, o.window), el('td', {}, o.source))));
}

function renderSettles(st) {
  const tbody = $('#settles tbody');
  if (!st.settles) {
    tbody.replaceChildren(el('tr', {}, el('td', { colspan: 4, class: 'note' }, 'the server counts no metrics')));
    return;
  }
  if (st.settles.length === 0) {
    tbody.replaceChildren(el('tr', {}, el('td', { colspan: 4, class: 'note' }, 'none yet')));
    return;
  }
  const num = (v, cls) => el('td', { class: 'num ' + cls }, String(v));
  tbody.replaceChildren(...st.settles.map((r) => el('tr', { 'data-policy': r.policy },
    el('td', {}, r.policy), num(r.charged, 'charged'), num(r.given_back, 'given-back'), num(r.owed, 'owed'))));
}

// fillTable fills the tbody of table with rows, or one note row: when the
// server counts no metrics (list is null), or list is empty (empty, or
// "none yet").
function fillTable(table, cols, list, row, empty) {
  const tbody = $(table + ' tbody');
  if (!list) {
    tbody.replaceChildren(el('tr', {}, el('td', { colspan: cols, class: 'note' }, 'the server counts no metrics')));
  } else if (list.length === 0) {
    tbody.replaceChildren(el('tr', {}, el('td', { colspan: cols, class: 'note' }, empty || 'none yet')));
  } else {
    tbody.replaceChildren(...list.map(row));
  }
}

const cellNum = (v, cls) => el('td', { class: 'num ' + cls }, String(v));
// ms spells a duration in ms in the unit that reads best, e.g. "12.5 ms",
// "1.50 s", "60.0 min".
function ms(v) {
  if (v < 1000) return v.toFixed(1) + ' ms';
  if (v < 60000) return (v / 1000).toFixed(2) + ' s';
  if (v < 3600000) return (v / 60000).toFixed(1) + ' min';
  return (v / 3600000).toFixed(2) + ' h';
}

function renderPriorities(st) {
  fillTable('#priorities', 6, st.priorities, (r) => el('tr', { 'data-policy': r.policy, 'data-class': r.class },
    el('td', {}, r.policy), el('td', {}, r.class), cellNum(r.share + '%', 'share'),
    cellNum(r.allowed, 'allowed'), cellNum(r.denied, 'denied'), cellNum(r.undecided, 'undecided')),
    'no policy declares priority classes');
}

function renderQueues(st) {
  fillTable('#queues', 6, st.queues, (r) => el('tr', { 'data-route': r.route },
    el('td', {}, r.route), cellNum(r.queued, 'queued'), cellNum(r.queued ? ms(r.mean_wait_ms) : '', 'mean-wait'),
    cellNum(r.past_max_delay, 'past-max-delay'), cellNum(r.queue_full, 'queue-full'), cellNum(r.abandoned, 'abandoned')));
}

function renderBookings(st) {
  fillTable('#bookings', 3, st.bookings, (r) => el('tr', { 'data-policy': r.policy },
    el('td', {}, r.policy), cellNum(r.waits, 'waits'), cellNum(ms(r.mean_delay_ms), 'mean-delay')));
}

// renderRLQS fills the Envoy quota buckets table; the section shows only
// on a server with envoy.rlqs.
function renderRLQS(st) {
  $('#rlqs-section').hidden = !st.rlqs;
  if (!st.rlqs) return;
  const num = (v) => (Math.round(v * 10) / 10).toString();
  fillTable('#rlqs', 9, st.rlqs, (b) => el('tr', { 'data-domain': b.domain, 'data-subject': b.subject },
    el('td', {}, b.domain), el('td', {}, b.policy), el('td', { class: 'subject', title: b.subject }, b.subject.slice(0, 12) + '…'),
    cellNum(b.streams, 'streams'), cellNum(num(b.demand), 'demand'), cellNum(num(b.rate), 'rate'), cellNum(num(b.burst), 'burst'),
    cellNum(b.allowed, 'allowed'), cellNum(b.denied, 'denied')), 'no bucket reported yet');
}

function renderLive(st) {
  const box = $('#live');
  if (!st.live) {
    box.replaceChildren(el('p', { class: 'note' }, 'The server counts no metrics, so there are no live decisions to show.'));
    return;
  }
  const W = 960, H = 90, n = st.live_seconds;
  const figs = st.live.map((s) => {
    let peak = 1;
    for (const c of Object.values(s.counts)) for (const v of c) peak = Math.max(peak, v);
    const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img',
      'aria-label': `decisions per second of ${s.policy}` });
    for (const o of OUTCOMES) {
      const c = s.counts[o];
      if (!c) continue;
      const pts = c.map((v, i) => `${(i * W / (n - 1)).toFixed(1)},${(H - 4 - v * (H - 8) / peak).toFixed(1)}`);
      svg.append(svgEl('polyline', { class: 'line ' + o, points: pts.join(' '), fill: 'none', 'stroke-width': '1.5' }));
    }
    const label = svgEl('text', { x: 4, y: 12, 'font-size': 11, fill: '#868e96' });
    label.textContent = `peak ${peak}/s · last ${Math.round(n / 60)} min`;
    svg.append(label);
    return el('div', { class: 'live-policy', 'data-policy': s.policy }, el('h3', {}, s.policy), svg);
  });
  box.replaceChildren(...figs);
}

async function poll() {
  try {
    const r = await fetch('/ui/api/state', { cache: 'no-store' });
    if (!r.ok) throw new Error(`GET /ui/api/state answered ${r.status}`);
    const st = await r.json();
    renderHeader(st);
    renderPolicies(st);
    renderOverrides(st);
    renderSettles(st);
    renderPriorities(st);
    renderQueues(st);
    renderBookings(st);
    renderRLQS(st);
    renderLive(st);
    showError('#state-error', '');
  } catch (e) {
    showError('#state-error', 'cannot read the server state: ' + e.message);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

async function runSimulation(ev) {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const body = {
    algorithm: f.get('algorithm'),
    limit: Number(f.get('limit')),
    window: f.get('window'),
    burst: Number(f.get('burst')),
    pattern: f.get('pattern'),
    rate: Number(f.get('rate')),
    duration: f.get('duration'),
    seed: Number(f.get('seed')),
  };
  const btn = ev.target.querySelector('button');
  btn.disabled = true;
  try {
    const r = await fetch('/ui/api/simulate', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    });
    const out = await r.json();
    if (!r.ok) throw new Error(out.error || `answered ${r.status}`);
    const doc = new DOMParser().parseFromString(out.svg, 'image/svg+xml');
    $('#sim-chart').replaceChildren(document.importNode(doc.documentElement, true));
    const rows = out.results.map((x) => el('tr', { 'data-algorithm': x.algorithm },
      el('td', {}, x.algorithm), el('td', { class: 'num' }, String(x.offered)), el('td', { class: 'num' }, String(x.admitted)),
      el('td', { class: 'num' }, String(x.max_in_window)), el('td', { class: 'num' }, x.max_ratio.toFixed(2)),
      el('td', { class: 'num' }, x.false_admit_pct.toFixed(1) + ' %'), el('td', { class: 'num' }, x.false_deny_pct.toFixed(1) + ' %')));
    $('#sim-results tbody').replaceChildren(...rows);
    $('#sim-results').hidden = false;
    showError('#sim-error', '');
  } catch (e) {
    showError('#sim-error', e.message);
  } finally {
    btn.disabled = false;
  }
}

$('#sim-form').addEventListener('submit', runSimulation);
poll();
