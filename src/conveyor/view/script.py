# ruff: noqa: E501  (the string is JavaScript; Python line length does not apply to it)
"""The page's JavaScript (plain, no library), inlined into the HTML.

Views are chosen by the URL hash (`#summary`, `#list`, `#t/<index>`, `#compare`). Token spans are
built only when a trajectory is shown, from the embedded id -> text table.
"""

SCRIPT = r"""
'use strict';
const D = JSON.parse(document.getElementById('run-data').textContent);
const T = D.trajectories;
const num = (v) => (typeof v === 'string' ? Number(v) : v);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({
  '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
const fmt = (v, d = 3) => (v === null || v === undefined ? '–'
  : Number.isFinite(num(v)) ? Number(num(v)).toFixed(d) : String(v));
const pct = (v) => (100 * v).toFixed(1) + '%';
const chip = (status, n) => `<span class="chip st-${esc(status)}">${esc(status)}` +
  (n === undefined ? '' : ` ${n}`) + '</span>';
// `head` (the early first turn) overlaps init and run, so it is drawn last, at half height.
const STAGES = {init: '#8fb3ee', run: '#3b73d9', reward: '#38a169', head: '#f2b45a'};
const SOURCE_LABEL = {eval: 'eval', eval_before: 'eval before training',
  eval_after_sft: 'eval after SFT', eval_after: 'eval after training', rollouts: 'training rollouts'};
const main = document.getElementById('main');

function tokenCount(t) { return t.blocks.reduce((n, b) => n + b.ids.length, 0); }
function hasGap(t) { return t.blocks.some((b) => b.tr); }
function passed(t) { return t.reward !== null && num(t.reward) >= 1; }

// ---------- summary ----------
function passTable(s) {
  const rows = s.pass_at_k.map((r) => `<tr><td>pass@${r.k}</td><td class="num">${pct(r.value)}` +
    `</td><td class="num">[${pct(r.ci[0])}, ${pct(r.ci[1])}]</td><td class="num">${r.tasks}</td></tr>`);
  return '<table class="passk"><tr><th></th><th>value</th><th>95% interval</th><th>tasks</th></tr>' +
    rows.join('') + '</table>';
}
function familyTable(s) {
  const rows = Object.entries(s.families).map(([name, b]) => `<tr><td>${esc(name)}</td>` +
    `<td class="num">${b.rollouts}</td><td class="num">${b.scored}</td>` +
    `<td class="num">${pct(b.pass1)} [${pct(b.pass1_ci[0])}, ${pct(b.pass1_ci[1])}]</td>` +
    `<td class="num">${fmt(b.mean_reward)}</td><td class="num">${fmt(b.mean_turns, 2)}</td>` +
    `<td class="num">${fmt(b.mean_hints, 2)}</td><td class="num">${b.splits}</td>` +
    `<td>${Object.entries(b.statuses).map(([k, n]) => chip(k, n)).join('')}</td></tr>`);
  return '<table class="families"><tr><th>family</th><th>rollouts</th><th>scored</th>' +
    '<th>pass@1 [95%]</th><th>mean reward</th><th>turns</th><th>hints</th><th>splits</th>' +
    '<th>statuses</th></tr>' + rows.join('') + '</table>';
}
function lineChart(title, series) {
  const W = 360, H = 200, L = 44, R = 10, TOP = 22, B = 26;
  const pts = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  if (!pts.length) return '';
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - TOP - B);
  const colors = ['#2f6fdf', '#d0661c', '#2b9a5b', '#8a5cd6'];
  let out = `<svg class="chart" width="${W}" height="${H}" data-title="${esc(title)}">` +
    `<text x="${L}" y="14" style="font-weight:600;fill:#1d2330">${esc(title)}</text>` +
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#ccc"/>` +
    `<line x1="${L}" y1="${TOP}" x2="${L}" y2="${H - B}" stroke="#ccc"/>` +
    `<text x="2" y="${sy(y1) + 4}">${fmt(y1, 3)}</text><text x="2" y="${sy(y0)}">${fmt(y0, 3)}</text>` +
    `<text x="${L}" y="${H - 8}">step ${x0}</text><text x="${W - R - 50}" y="${H - 8}">step ${x1}</text>`;
  series.forEach((s, k) => {
    const ok = s.points.filter((p) => Number.isFinite(p[1]));
    const c = colors[k % colors.length];
    out += `<polyline fill="none" stroke="${c}" stroke-width="1.5" points="` +
      ok.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ') + '"/>';
    out += ok.map((p) => `<circle cx="${sx(p[0]).toFixed(1)}" cy="${sy(p[1]).toFixed(1)}" r="2.5" ` +
      `fill="${c}"><title>${esc(s.name)} step ${p[0]}: ${fmt(p[1], 4)}</title></circle>`).join('');
    out += `<text x="${L + 6}" y="${TOP + 10 + 12 * k}" style="fill:${c}">${esc(s.name)}</text>`;
  });
  return out + '</svg>';
}
function curves() {
  if (!D.metrics.length) return '';
  const series = (key) => ({name: key, points: D.metrics.filter((r) => key in r)
    .map((r) => [num(r.step), num(r[key])])});
  const panels = [['reward', ['rollout/reward_mean', 'rollout/pass_rate']], ['loss', ['train/loss']],
    ['|trainer − engine| logprob', ['train/logprob_diff_mean', 'train/logprob_diff_max']]];
  const charts = panels.map(([title, keys]) => lineChart(title, keys.map(series))).join('');
  return `<section id="curves"><h2>Training curves <span class="muted">(metrics.jsonl, ` +
    `${D.metrics.length} steps)</span></h2><div class="charts">${charts}</div></section>`;
}
// Stage times are seconds since the dispatcher's batch started, and training starts a batch per
// step, so a training run's timeline is drawn one step at a time.
function timelineSvg(rows) {
  const start = (t) => Math.min(...Object.keys(STAGES).map((s) => t.timings[s + '_start'])
    .filter(Number.isFinite));
  rows.sort((a, b) => start(a) - start(b));
  const shown = rows.slice(0, 400);
  const t0 = Math.min(...shown.map(start));
  const t1 = Math.max(...shown.flatMap((t) => Object.keys(STAGES)
    .map((s) => t.timings[s + '_end']).filter(Number.isFinite)));
  const W = 900, L = 6, rowH = Math.max(2, Math.min(8, Math.floor(320 / shown.length)));
  const H = shown.length * rowH + 24, sx = (x) => L + (x - t0) / Math.max(t1 - t0, 1e-9) * (W - 2 * L);
  let out = `<svg class="timeline" width="${W}" height="${H}">`;
  shown.forEach((t, r) => {
    for (const [s, c] of Object.entries(STAGES)) {
      const a = t.timings[s + '_start'], b = t.timings[s + '_end'];
      if (!Number.isFinite(a) || !Number.isFinite(b)) continue;
      out += `<rect x="${sx(a).toFixed(1)}" y="${r * rowH}" width="${Math.max(0.5, sx(b) - sx(a)).toFixed(1)}"` +
        ` height="${Math.max(1, (rowH - 1) / (s === 'head' ? 2 : 1))}" fill="${c}"><title>${esc(t.task_id)}#${t.sample_index} ` +
        `${s}: ${(b - a).toFixed(2)} s</title></rect>`;
    }
  });
  out += `<text x="${L}" y="${H - 6}">0 s</text><text x="${W - 70}" y="${H - 6}">${(t1 - t0).toFixed(1)} s</text></svg>`;
  const cut = rows.length > shown.length ? `<p class="muted">first ${shown.length} of ${rows.length} rollouts</p>` : '';
  return cut + out;
}
function timelineRows(source, step) {
  return T.filter((t) => t.source === source && !t.superseded && 'run_start' in t.timings &&
    (step === null || String(t.step) === String(step)));
}
function timeline(source) {
  const rows = timelineRows(source, null);
  if (!rows.length) return '';
  const steps = [...new Set(rows.map((t) => t.step).filter((s) => s !== null && s !== undefined))]
    .sort((a, b) => a - b);
  const last = steps.length ? steps[steps.length - 1] : null;
  const pick = steps.length ? ` <select class="timeline-step">${steps.map((s) => `<option` +
    `${s === last ? ' selected' : ''}>${s}</option>`).join('')}</select>` : '';
  const legend = Object.entries(STAGES).map(([s, c]) => `<span style="color:${c}">■ ${s}</span>`).join('');
  return `<h3>Dispatcher timeline${steps.length ? ', step' : ''}${pick}</h3><div class="legend">${legend}` +
    `</div><div class="timeline-box">${timelineSvg(timelineRows(source, last))}</div>`;
}
function wireTimelines() {
  main.querySelectorAll('section.source').forEach((sec) => {
    const select = sec.querySelector('select.timeline-step');
    if (select) select.addEventListener('change', () => {
      sec.querySelector('.timeline-box').innerHTML = timelineSvg(timelineRows(sec.dataset.source, select.value));
    });
  });
}
function runFacts() {
  // summary.json: model, engine and wall time of an eval; stage timings of a training run.
  const s = D.reports.summary || {};
  const facts = [];
  for (const key of ['model', 'engine', 'steps']) if (key in s) facts.push(`${key} ${esc(s[key])}`);
  for (const key of ['wall_s', 'engine_start_s']) if (key in s) facts.push(`${key} ${fmt(s[key], 1)}`);
  for (const [key, v] of Object.entries(s.timings || {})) facts.push(`${esc(key)} ${fmt(v, 1)}`);
  return facts.length ? `<p class="muted run-facts">${facts.join(' · ')}</p>` : '';
}
function showSummary() {
  let html = runFacts() + D.warnings.map((w) => `<p class="warn">⚠ ${esc(w)}</p>`).join('');
  html += curves();
  for (const src of D.sources) {
    const o = src.summary.overall;
    html += `<section class="source" data-source="${esc(src.name)}"><h2>` +
      `${esc(SOURCE_LABEL[src.name] || src.name)} <span class="muted">${o.rollouts} rollouts, ` +
      `${o.scored} scored, mean reward ${fmt(o.mean_reward)}</span></h2>` +
      `<div>${Object.entries(o.statuses).map(([k, n]) => chip(k, n)).join('')}</div>` +
      `<h3>pass@k</h3>${passTable(src.summary)}<h3>Per family</h3>${familyTable(src.summary)}` +
      `${timeline(src.name)}</section>`;
  }
  main.innerHTML = html;
  wireTimelines();
}

// ---------- list ----------
const filters = {source: '', family: '', status: '', reward: '', splits: '', hints: '', q: ''};
function options(name, values) {
  return `<label>${name} <select data-filter="${name}"><option value="">all</option>` +
    values.map((v) => `<option value="${esc(v)}"${filters[name] === String(v) ? ' selected' : ''}>` +
    `${esc(v)}</option>`).join('') + '</select></label>';
}
function keep(t) {
  const f = filters, c = t.counters;
  if (f.source && t.source !== f.source) return false;
  if (f.family && t.family !== f.family) return false;
  if (f.status && t.status !== f.status) return false;
  if (f.reward === 'passed' && !passed(t)) return false;
  if (f.reward === 'failed' && (t.reward === null || passed(t))) return false;
  if (f.reward === 'unscored' && t.reward !== null) return false;
  if (f.splits && ((c.splits || 0) > 0) !== (f.splits === 'with')) return false;
  if (f.hints && ((c.hints || 0) > 0) !== (f.hints === 'with')) return false;
  if (f.q && !t.task_id.toLowerCase().includes(f.q.toLowerCase())) return false;
  return true;
}
function listRows() {
  const rows = T.filter(keep);
  document.getElementById('count').textContent = `${rows.length} of ${T.length} trajectories`;
  document.getElementById('rows').innerHTML = rows.map((t) => `<tr class="traj-row" ` +
    `data-i="${t.i}" data-task-id="${esc(t.task_id)}" data-sample-index="${t.sample_index}" ` +
    `data-status="${esc(t.status)}"><td>${esc(SOURCE_LABEL[t.source] || t.source)}` +
    `${t.step === null || t.step === undefined ? '' : ' step ' + t.step}${t.superseded ? ' (refilled)' : ''}` +
    `</td><td>${esc(t.task_id)}</td><td class="num">${t.sample_index}</td><td>${esc(t.family)}</td>` +
    `<td>${chip(t.status)}</td><td class="num">${fmt(t.reward, 2)}</td><td class="num">` +
    `${t.blocks.reduce((n, b) => n + b.turns.length, 0)}</td><td class="num">${t.counters.hints || 0}` +
    `</td><td class="num">${t.counters.splits || 0}</td><td class="num">${tokenCount(t)}</td></tr>`).join('');
}
function showList() {
  const uniq = (k) => [...new Set(T.map((t) => t[k]))].sort();
  main.innerHTML = '<section><div class="filters">' + options('source', uniq('source')) +
    options('family', uniq('family')) + options('status', uniq('status')) +
    options('reward', ['passed', 'failed', 'unscored']) + options('splits', ['with', 'without']) +
    options('hints', ['with', 'without']) + `<label>task id <input id="q" type="search" ` +
    `value="${esc(filters.q)}" placeholder="search"></label><span id="count" class="muted"></span>` +
    '</div><table class="list"><thead><tr><th>source</th><th>task</th><th>sample</th><th>family</th>' +
    '<th>status</th><th>reward</th><th>turns</th><th>hints</th><th>splits</th><th>tokens</th></tr>' +
    '</thead><tbody id="rows"></tbody></table></section>';
  main.querySelectorAll('select[data-filter]').forEach((s) => s.addEventListener('change', () => {
    filters[s.dataset.filter] = s.value; listRows(); }));
  document.getElementById('q').addEventListener('input', (e) => { filters.q = e.target.value; listRows(); });
  document.getElementById('rows').addEventListener('click', (e) => {
    const row = e.target.closest('tr.traj-row');
    if (row) location.hash = '#t/' + row.dataset.i;
  });
  listRows();
}

// ---------- trajectory ----------
function heat(lp) {
  // p = exp(logprob): red for unlikely tokens, green for confident ones.
  const p = Math.exp(lp);
  return `hsl(${Math.round(120 * p)},75%,${Math.round(88 - 10 * p)}%)`;
}
function gapColor(g) { return `hsl(0,80%,${Math.round(100 - Math.min(1, g / 0.5) * 40)}%)`; }
function tokenSpans(b) {
  const starts = new Map(b.turns.map((t, k) => [t[0], [k, t]]));
  const inGen = new Uint8Array(b.ids.length);
  for (const [s, e] of b.turns) inGen.fill(1, s, e);
  const parts = [];
  for (let j = 0; j < b.ids.length; j++) {
    if (starts.has(j)) {
      const [k, t] = starts.get(j);
      parts.push(`<span class="turn-mark" data-turn="${k}">turn ${k + 1} · v${t[2]} · ${esc(t[3])}</span>`);
    }
    const id = b.ids[j], text = D.vocab[id] ?? `⟨${id}⟩`, lp = b.lp[j];
    let style = '', lpAttr = '';
    if (lp !== null) { lpAttr = String(num(lp)); style = `--lp:${heat(num(lp))};`; }
    let trAttr = '';
    if (b.tr && b.tr[j] !== null && lp !== null) {
      trAttr = ` data-trainer-logprob="${num(b.tr[j])}"`;
      style += `--gap:${gapColor(Math.abs(num(b.tr[j]) - num(lp)))};`;
    }
    parts.push(`<span class="tok ${inGen[j] ? 'gen' : 'ctx'}" data-id="${id}" data-mask="${b.mask[j]}" ` +
      `data-logprob="${lpAttr}"${trAttr}${style ? ` style="${style}"` : ''}>` +
      `${esc(text.replace(/\n/g, '↵\n'))}</span>`);
  }
  return parts.join('');
}
function messageCards(t) {
  return t.messages.map((m) => {
    const calls = m.tool_calls ? `<pre class="tool-calls">${esc(JSON.stringify(m.tool_calls, null, 1))}</pre>` : '';
    const content = typeof m.content === 'string' ? m.content : JSON.stringify(m.content, null, 1);
    return `<div class="msg role-${esc(m.role)}${m._hint ? ' hint' : ''}"><b>${esc(m.role)}</b>` +
      `${m._hint ? ' <span class="chip">hint</span>' : ''}${m.name ? ' ' + esc(m.name) : ''}` +
      `<pre>${esc(content ?? '')}</pre>${calls}</div>`;
  }).join('');
}
function breakdown(t) {
  const stages = Object.keys(STAGES).filter((s) => (s + '_end') in t.timings)
    .map((s) => `${s} ${(t.timings[s + '_end'] - t.timings[s + '_start']).toFixed(2)} s`);
  const answer = t.messages.filter((m) => m.role === 'answer').map((m) => m.content);
  const rows = [['reward', fmt(t.reward, 4)], ['status', chip(t.status)],
    ['stop reason', esc(t.stop_reason || '–')], ['answer', esc(answer.length ? answer.join(' ') : '–')],
    ['error', esc(t.error || '–')],
    ['counters', Object.entries(t.counters).map(([k, v]) => `${esc(k)}=${v}`).join(', ') || '–'],
    ['metrics', Object.entries(t.metrics).map(([k, v]) => `${esc(k)}=${fmt(v, 3)}`).join(', ') || '–'],
    ['stages', stages.join(', ') || '–']];
  return '<table class="breakdown">' + rows.map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`).join('') +
    '</table>';
}
function trajectoryPane(t) {
  const gap = hasGap(t);
  const modes = ['mask', 'logprob'].concat(gap ? ['gap'] : []);
  const blocks = t.blocks.map((b) => `<div class="sample-head">sample ${b.sample}` +
    `${b.broken ? ' <span class="warn">(turn breaks the prefix property: shown alone)</span>' : ''}` +
    ` <span class="muted">${b.ids.length} tokens, ${b.turns.length} turns</span></div>` +
    `<div class="sample" data-sample="${b.sample}">${tokenSpans(b)}</div>`).join('');
  const where = `${SOURCE_LABEL[t.source] || t.source}${t.step === null || t.step === undefined ? '' : ' · step ' + t.step}`;
  return `<div class="trajectory" data-task-id="${esc(t.task_id)}" data-sample-index="${t.sample_index}">` +
    `<section><h2>${esc(t.task_id)} <span class="muted">sample ${t.sample_index} · ${esc(t.family)} · ` +
    `${esc(where)}</span></h2><h3>Reward breakdown</h3>${breakdown(t)}</section>` +
    `<section><h3>Messages and tool calls</h3>${messageCards(t)}</section>` +
    `<section><h3>Tokens</h3><div class="legend">colour: ${modes.map((m) => `<label><input type="radio" ` +
    `name="mode-${t.i}" value="${m}"${m === 'mask' ? ' checked' : ''}> ${m === 'gap' ?
      'trainer − engine gap' : m === 'mask' ? 'loss mask (blue = trained on)' : 'logprob (red = unlikely)'}` +
    `</label>`).join(' ')}${gap ? '' : ' <span class="muted">(no trainer_logprobs recorded)</span>'}</div>` +
    `<div class="tokens mode-mask">${blocks}</div><div class="tokinfo">hover a token</div></section></div>`;
}
function wirePane(el) {
  const box = el.querySelector('.tokens'), info = el.querySelector('.tokinfo');
  el.querySelectorAll('input[type=radio]').forEach((r) => r.addEventListener('change', () => {
    box.className = 'tokens mode-' + r.value; }));
  box.addEventListener('mouseover', (e) => {
    const s = e.target.closest('.tok');
    if (!s) return;
    const lp = s.dataset.logprob, tr = s.dataset.trainerLogprob;
    info.textContent = `id ${s.dataset.id} ${JSON.stringify(D.vocab[s.dataset.id] ?? '')} · mask ` +
      `${s.dataset.mask}` + (lp === '' ? ' · context (not generated)' :
      ` · logprob ${Number(lp).toFixed(4)} · p ${Math.exp(Number(lp)).toFixed(3)}`) +
      (tr === undefined ? '' : ` · trainer ${Number(tr).toFixed(4)} · gap ${Math.abs(tr - lp).toFixed(4)}`);
  });
}
function showTrajectory(i) {
  const t = T[i];
  if (!t) { main.innerHTML = `<p class="warn">no trajectory ${esc(i)}</p>`; return; }
  main.innerHTML = '<p><a href="#list">← trajectories</a></p>' + trajectoryPane(t);
  wirePane(main.querySelector('.trajectory'));
}

// ---------- before / after ----------
function showCompare(task) {
  const tasks = D.compare;
  if (!tasks.length) { main.innerHTML = '<p class="muted">no eval task both before and after training</p>'; return; }
  task = task && tasks.includes(task) ? task : tasks[0];
  const pick = (src) => T.find((t) => t.source === src && t.task_id === task);
  const sel = `<label>eval task <select id="cmp">${tasks.map((k) => `<option${k === task ? ' selected' : ''}>` +
    `${esc(k)}</option>`).join('')}</select></label>`;
  main.innerHTML = `<section>${sel} <span class="muted">tasks whose reward changed are listed first</span>` +
    `</section><div class="side"><div><h2>before training</h2>${trajectoryPane(pick('eval_before'))}</div>` +
    `<div><h2>after training</h2>${trajectoryPane(pick('eval_after'))}</div></div>`;
  main.querySelectorAll('.trajectory').forEach(wirePane);
  document.getElementById('cmp').addEventListener('change', (e) => {
    location.hash = '#compare/' + encodeURIComponent(e.target.value); });
}

function route() {
  const h = location.hash || '#summary';
  document.querySelectorAll('header nav a').forEach((a) => a.classList.toggle('active',
    h.startsWith(a.getAttribute('href'))));
  if (h.startsWith('#t/')) showTrajectory(Number(h.slice(3)));
  else if (h.startsWith('#list')) showList();
  else if (h.startsWith('#compare')) showCompare(decodeURIComponent(h.slice(9)));
  else showSummary();
  window.scrollTo(0, 0);
}
if (!D.compare.length) document.getElementById('nav-compare').remove();
window.addEventListener('hashchange', route);
route();
document.body.dataset.ready = '1';
"""
