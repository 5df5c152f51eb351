// The Platform page's script (docs/api.md): keeps the API token of this tab, reads what runs
// where, deploys, queues and workers from /api/v1 with it, draws a deploy's timeline as an SVG
// picture, and sends approve / reject / cancel / rollback / redeploy / promote / abort. Vanilla JavaScript, inlined by platform.rs;
// every piece of data reaches the DOM as text (textContent, setAttribute), never as markup.
'use strict';

(function () {
  const REFRESH_MS = 3000;
  const STATUSES = ['ENQUEUED', 'PENDING', 'SUCCESS', 'ERROR', 'CANCELLED'];
  const STORAGE_KEY = 'manent.token';
  // The SVG namespace, taken from the document's own <svg> so the page names no URL.
  const SVG_NS = document.getElementById('timeline').namespaceURI;

  let token = '';
  let timer = null;
  let busy = false;
  // The token's role and scope (`GET /whoami`), for what only an admin may do.
  let me = null;
  // The deploy whose output is shown, and the last output line read (`seq`).
  let outputOf = null;
  let outputSeq = 0;

  const $ = (id) => document.getElementById(id);

  /** An element with attributes (set as attribute values) and children (strings become text). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    return fill(node, attrs, children);
  }

  function svg(tag, attrs, ...children) {
    return fill(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  function fill(node, attrs, children) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // A target's outcome (or a step's RUNNING), coloured like the deploy status it amounts to.
  const TARGET_STATUSES = {
    deployed: 'SUCCESS', planned: 'SUCCESS', failed: 'ERROR', rolled_back: 'CANCELLED',
    deploying: 'PENDING', RUNNING: 'PENDING', cancelled: 'CANCELLED',
    // A step the deploy's end stopped (cancelled, or failed elsewhere).
    STOPPED: 'CANCELLED',
    // A target an ended deploy never reached.
    'not started': 'CANCELLED',
    // A step whose worker is gone (it runs again where the deploy resumes).
    INTERRUPTED: 'CANCELLED',
  };

  function statusClass(status) {
    if (STATUSES.includes(status)) return status;
    return Object.prototype.hasOwnProperty.call(TARGET_STATUSES, status) ? TARGET_STATUSES[status] : '';
  }

  // ---- the token -------------------------------------------------------------------------

  function loadToken() {
    try { token = sessionStorage.getItem(STORAGE_KEY) || ''; } catch (_) { token = ''; }
  }

  function saveToken(value) {
    token = value.trim();
    try {
      if (token) sessionStorage.setItem(STORAGE_KEY, token);
      else sessionStorage.removeItem(STORAGE_KEY);
    } catch (_) { /* storage refused: the token lives in this page only */ }
  }

  /** `#token=…` (with `&deploy=…` or not): taken into the tab's storage, then removed from the URL. */
  function takeTokenFromFragment() {
    const params = new URLSearchParams(location.hash.slice(1));
    if (!params.has('token')) return;
    saveToken(params.get('token') || '');
    params.delete('token');
    const rest = params.toString();
    history.replaceState(null, '', location.pathname + location.search + (rest ? '#' + rest : ''));
  }

  // ---- the API ---------------------------------------------------------------------------

  class ApiError extends Error {}

  async function api(method, path, body) {
    const headers = { Authorization: 'Bearer ' + token, Accept: 'application/json' };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch('/api/v1' + path, init);
    } catch (e) {
      throw new ApiError('the API is unreachable: ' + e.message);
    }
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (!response.ok) {
      const err = data && data.error;
      const what = err ? err.code + ': ' + err.message + (err.field ? ' (field ' + err.field + ')' : '') : text;
      throw new ApiError(method + ' ' + path + ' → ' + response.status + ' ' + what);
    }
    return data;
  }

  function showError(message) {
    const box = $('error');
    box.textContent = message;
    box.hidden = false;
  }

  function clearError() {
    $('error').hidden = true;
    $('error').textContent = '';
  }

  // ---- shared pieces ---------------------------------------------------------------------

  function replaceRows(table, rows, columns) {
    const body = table.tBodies[0];
    body.replaceChildren(...rows);
    if (rows.length === 0) {
      body.append(el('tr', {}, el('td', { class: 'empty', colspan: columns }, 'none')));
    }
  }

  function statusCell(status) {
    return el('td', {}, el('span', { class: 'status ' + statusClass(status) }, status));
  }

  /** A link to a deploy's page; `short` shows its id's first 8 characters, whole on hover. */
  function deployLink(id, short) {
    const text = short ? shortId(id) : id;
    return el('a', { href: '#deploy=' + encodeURIComponent(id), class: 'id', title: id }, text);
  }

  /** As the CLI's tables show ids: 8 characters; a scheduled run keeps its tick. */
  function shortId(id) {
    const at = id.indexOf('@');
    const head = at < 0 ? id : id.slice(0, at);
    const kept = head.slice(0, head.startsWith('sch-') ? 12 : 8);
    return at < 0 ? kept : kept + id.slice(at);
  }

  /** `5m ago` from an RFC 3339 time, its exact time on hover. */
  function since(at) {
    if (!at) return el('span', {}, '—');
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(at)) / 1000));
    const text = seconds < 60 ? seconds + 's ago'
      : seconds < 3600 ? Math.floor(seconds / 60) + 'm ago'
        : seconds < 86400 ? Math.floor(seconds / 3600) + 'h ago'
          : Math.floor(seconds / 86400) + 'd ago';
    return el('span', { title: at }, text);
  }

  function age(seconds) {
    if (seconds < 60) return seconds + 's ago';
    if (seconds < 3600) return Math.floor(seconds / 60) + 'm ' + (seconds % 60) + 's ago';
    return Math.floor(seconds / 3600) + 'h ' + Math.floor((seconds % 3600) / 60) + 'm ago';
  }

  function duration(ms) {
    if (!isFinite(ms) || ms < 0) return '';
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    return Math.floor(ms / 60000) + ' min ' + Math.round((ms % 60000) / 1000) + ' s';
  }

  const ACTION_LABELS = {
    approve: 'Approve', reject: 'Reject', cancel: 'Cancel', redeploy: 'Redeploy', promote: 'Promote', abort: 'Abort',
  };

  /**
   * The buttons of what this token may do to the deploy now, as the server says (`actions`);
   * a list's rows leave Redeploy to the deploy's own page.
   */
  function actionButtons(d, inList) {
    return (d.actions || []).filter((a) => ACTION_LABELS[a] && !(inList && a === 'redeploy')).map((a) =>
      el('button', { type: 'button', class: a, 'data-action': a, 'data-id': d.id }, ACTION_LABELS[a]));
  }

  /** An environment's Rollback button, for a token that may deploy its application. */
  function rollbackButton(app, environment) {
    if (!app.can_deploy || !(app.live || {})[environment]) return null;
    return el('button', {
      type: 'button', class: 'rollback', 'data-action': 'rollback',
      'data-id': app.application + ' ' + environment,
    }, 'Rollback');
  }

  /** An environment's Variables button, for a token that may deploy its application. */
  function variablesButton(app, environment) {
    if (!app.can_deploy) return null;
    return el('button', {
      type: 'button', class: 'variables', 'data-action': 'variables',
      'data-id': app.application + ' ' + environment,
    }, 'Variables');
  }

  /** An environment's variables per target (secrets as ***), below the applications. */
  async function showVariables(id) {
    const [application, environment] = id.split(' ');
    const [tenant, app] = application.split('/');
    let rows;
    try {
      rows = await api('GET', '/apps/' + encodeURIComponent(tenant) + '/' + encodeURIComponent(app) +
        '/environments/' + encodeURIComponent(environment) + '/vars');
      clearError();
    } catch (e) {
      showError(e.message);
      return;
    }
    $('variables-of').textContent = application + ' ' + environment;
    replaceRows($('variables'), rows.map((v) => el('tr', {},
      el('td', {}, v.target), el('td', {}, el('code', {}, v.name)),
      el('td', {}, v.value), el('td', {}, v.source))), 4);
    $('variables-section').hidden = false;
  }

  /** A dead or stopped worker's Recover button, for an unscoped admin. */
  function workerButtons(w) {
    const admin = me && me.role === 'admin' && !me.scope;
    if (!admin || !(w.state === 'dead' || w.state === 'stopped') || !w.running) return [];
    return [el('button', { type: 'button', class: 'recover', 'data-action': 'recover', 'data-id': w.executor_id }, 'Recover')];
  }

  async function act(action, id) {
    if (action === 'variables') return showVariables(id);
    let body;
    let path = '/deploys/' + encodeURIComponent(id) + '/' + action;
    if (action === 'rollback') {
      // `tenant/app environment`
      const [application, environment] = id.split(' ');
      if (!confirm('Roll ' + application + ' back in ' + environment + ' to the version before the live one?')) return;
      const [tenant, app] = application.split('/');
      path = '/apps/' + encodeURIComponent(tenant) + '/' + encodeURIComponent(app) +
        '/environments/' + encodeURIComponent(environment) + '/rollback';
    } else if (action === 'redeploy') {
      if (!confirm('Deploy again what deploy ' + id + ' deployed, as it recorded it?')) return;
    } else if (action === 'reject') {
      const reason = prompt('Reject deploy ' + id + ': why?');
      if (reason === null) return;
      body = { reason };
    } else if (action === 'approve') {
      const reason = prompt('Approve deploy ' + id + ' (comment, optional):', '');
      if (reason === null) return;
      body = reason.trim() ? { reason: reason.trim() } : undefined;
    } else if (action === 'promote') {
      // docs/analysis.md: the rest of the bake is skipped, or a wait for a decision passes.
      const reason = prompt('Promote deploy ' + id + ': its analysis passes and the next wave starts (comment, optional):', '');
      if (reason === null) return;
      body = reason.trim() ? { reason: reason.trim() } : undefined;
    } else if (action === 'abort') {
      const reason = prompt('Abort deploy ' + id + ': it fails, and rollback.on_failure applies. Why?');
      if (reason === null) return;
      body = reason.trim() ? { reason: reason.trim() } : undefined;
    } else if (action === 'cancel') {
      if (!confirm('Cancel deploy ' + id + '?')) return;
    } else if (action === 'recover') {
      if (!confirm('Hand the deploys of worker ' + id + ' to other workers?')) return;
    } else {
      return;
    }
    if (action === 'recover') path = '/executors/' + encodeURIComponent(id) + '/recover';
    let answer;
    try {
      answer = await api('POST', path, body);
      clearError();
    } catch (e) {
      showError(e.message);
      return;
    }
    // A rollback or a redeploy made a new deploy: its page.
    if ((action === 'rollback' || action === 'redeploy') && answer && answer.id) {
      location.hash = '#deploy=' + encodeURIComponent(answer.id);
      return;
    }
    refresh();
  }

  document.addEventListener('click', (event) => {
    const button = event.target.closest('button[data-action]');
    if (button) act(button.getAttribute('data-action'), button.getAttribute('data-id'));
  });

  // ---- the overview ----------------------------------------------------------------------

  function deployRows(deploys) {
    return deploys.map((d) => el('tr', { 'data-deploy': d.id },
      el('td', {}, deployLink(d.id, true)),
      el('td', {}, d.application),
      el('td', {}, d.environment),
      el('td', {}, d.version + (d.dry_run ? ' (dry run)' : '')),
      statusCell(d.status),
      el('td', {}, d.phase),
      el('td', {}, d.waiting_for || ''),
      el('td', {}, since(d.created_at), ' by ' + d.submitted_by),
      el('td', {}, d.duration_ms === null || d.duration_ms === undefined ? '' : duration(d.duration_ms)),
      el('td', {}, d.executor_id || ''),
      el('td', { class: 'actions' }, ...actionButtons(d, true))));
  }

  /** An environment's last drift check (docs/plan-and-drift.md): state, drifted targets, when. */
  function driftCell(check) {
    if (!check) return el('td', { class: 'drift' }, 'unknown (never checked)');
    const state = check.drifted_targets > 0
      ? 'drifted ' + check.drifted_targets + ' of ' + check.targets + ' targets' : check.state;
    return el('td', { class: 'drift', 'data-drift': check.state, title: check.checked_at },
      state + ', checked ', since(check.checked_at));
  }

  /** One row per application and environment: what runs there, since when, by whom. */
  function appRows(apps) {
    const rows = [];
    for (const a of apps) {
      for (const environment of a.environments || []) {
        const live = (a.live || {})[environment];
        rows.push(el('tr', { 'data-app': a.application, 'data-environment': environment },
          el('td', {}, a.application),
          el('td', {}, environment),
          el('td', { class: 'live' }, live ? live.version : '—'),
          el('td', {}, live ? since(live.finished_at) : ''),
          el('td', {}, live && live.submitted_by ? live.submitted_by : ''),
          el('td', {}, live ? deployLink(live.deploy_id, true) : ''),
          driftCell((a.drift_checks || {})[environment]),
          el('td', { class: 'actions' }, rollbackButton(a, environment), variablesButton(a, environment))));
      }
    }
    return rows;
  }

  async function showOverview() {
    const [apps, queues, workers, activity] = await Promise.all([
      api('GET', '/apps'),
      api('GET', '/queues'),
      api('GET', '/workers'),
      api('GET', '/activity'),
    ]);
    replaceRows($('apps'), appRows(apps), 8);
    replaceRows($('queues'), queues.map((q) => el('tr', { 'data-queue': q.name },
      el('td', {}, el('code', {}, q.name)),
      el('td', {}, q.kind),
      el('td', {}, q.concurrency + ' / ' + q.environment_concurrency + ' / ' + q.global_concurrency),
      el('td', {}, q.enqueued),
      el('td', {}, q.running),
      el('td', {}, (q.workers || []).join(', ')))), 6);
    replaceRows($('workers'), workers.map((w) => el('tr', { 'data-worker': w.executor_id },
      el('td', {}, el('code', {}, w.executor_id)),
      el('td', {}, w.host),
      el('td', {}, w.region || ''),
      el('td', {}, el('span', { class: (w.state === 'dead' || w.state === 'suspect') ? 'stale' : '' }, w.state)),
      el('td', { title: w.heartbeat_at }, age(w.heartbeat_age_secs)),
      el('td', {}, w.running),
      el('td', {}, (w.queues || []).join(', ')),
      el('td', {}, w.version),
      el('td', { class: 'actions' }, ...workerButtons(w)))), 9);
    replaceRows($('activity'), deployRows(activity), 11);
  }

  // ---- a deploy's page -------------------------------------------------------------------

  /** The plan of a deploy waiting for approval (docs/plan-and-drift.md): one row per target. */
  function planRows(plan) {
    if (!plan) return [];
    const short = (v) => (v === null || v === undefined) ? 'none' : (/^[0-9a-f]{64}$/.test(v) ? v.slice(0, 12) + '…' : v);
    const change = (what, c) => el('li', {}, what + ' ' + c.name + ': ' + short(c.from) + ' → ' + short(c.to) + (c.note ? ' (' + c.note + ')' : ''));
    const rows = plan.targets.map((t) => {
      const items = [];
      for (const c of t.artifacts || []) items.push(change('artifact', c));
      if (t.files_changed > 0) {
        const more = t.files_changed - (t.files || []).length;
        items.push(el('li', {}, t.files_changed + ' file(s) would change: ' + (t.files || []).join(', ') + (more > 0 ? ' and ' + more + ' more' : '')));
      }
      for (const c of t.templates || []) items.push(change('template', c));
      for (const c of t.variables || []) items.push(change('variable', c));
      return ['Plan ' + t.name, el('div', { class: 'plan', 'data-plan-target': t.name },
        (t.from_version || 'nothing recorded') + ' → ' + t.to_version, el('ul', {}, ...items))];
    });
    if (plan.more_targets > 0) rows.push(['Plan', 'and ' + plan.more_targets + ' more target(s)']);
    if (plan.note) rows.push(['Plan note', plan.note]);
    return rows;
  }

  function facts(d) {
    const rows = [
      ['Application', d.application], ['Environment', d.environment], ['Version', d.version],
      ['Status', el('span', { class: 'status ' + statusClass(d.status) }, d.status)],
      ['Phase', d.phase], ['Waiting for', d.waiting_for || '—'], ['Queue', d.queue + ' (' + d.route_kind + ')'],
      ['Executor', d.executor_id || '—'], ['Dry run', d.dry_run ? 'yes' : 'no'],
      ['Submitted', el('span', {}, since(d.created_at), ' by ' + d.submitted_by)], ['Updated', d.updated_at],
    ];
    if (d.duration_ms !== null && d.duration_ms !== undefined) rows.push(['Duration', duration(d.duration_ms)]);
    if (d.redeploy_of) {
      rows.push(['Origin', el('span', {}, (d.redeploy_kind || 'redeploy') + ' of ', deployLink(d.redeploy_of, true))]);
    }
    // What an approver decides on: each artifact with where it comes from and its sha256,
    // and the version it would replace.
    for (const a of d.artifacts || []) {
      rows.push(['Artifact ' + a.name, el('span', { class: 'artifact' },
        a.type + ' ' + a.version + ' from ', el('code', {}, a.url), ', sha256 ', el('code', { class: 'sha256' }, a.sha256))]);
    }
    if (d.deployed_now) rows.push(['Live there now', d.deployed_now]);
    rows.push(...planRows(d.plan));
    for (const [key, value] of Object.entries(d.overrides || {})) {
      rows.push(['Overrides deploy.' + key, el('code', {}, JSON.stringify(value))]);
    }
    if (d.error) rows.push(['Error', d.error]);
    const out = [];
    for (const [name, value] of rows) out.push(el('dt', {}, name), el('dd', {}, value));
    return out;
  }

  /** The deploy's steps in the order they started. */
  function stepsByStart(d) {
    return (d.steps || []).map((s, i) => ({ s, i }))
      .sort((a, b) => (Date.parse(a.s.started_at) - Date.parse(b.s.started_at)) || (a.i - b.i))
      .map((x) => x.s);
  }

  /** The target a step (or an output line's source) works on (`<target>: …`), or ''. */
  function targetOf(name, targets) {
    const target = targets.find((t) => name.startsWith(t.name + ':'));
    return target ? target.name : '';
  }

  const TERMINAL = ['SUCCESS', 'ERROR', 'CANCELLED'];

  /**
   * When a step's bar ends: its finish; for a step still RUNNING, now while the deploy runs,
   * or the deploy's end when it ended under the step (cancelled, failed over).
   */
  function stepEnd(s, d, now) {
    const start = Date.parse(s.started_at);
    if (s.finished_at) return Date.parse(s.finished_at);
    if (s.status !== 'RUNNING') return start;
    if (TERMINAL.includes(d.status)) return d.finished_at ? Date.parse(d.finished_at) : start;
    return now;
  }

  /** A step RUNNING in a deploy that still runs: drawn growing, with its elapsed time. */
  function isRunning(s, d) {
    return s.status === 'RUNNING' && !TERMINAL.includes(d.status);
  }

  function barClass(s, d) {
    if (s.status === 'RUNNING') return isRunning(s, d) ? 'PENDING' : 'CANCELLED';
    return statusClass(s.status);
  }

  /**
   * The timeline's rows, top to bottom: the deploy's own steps, then one band per wave of
   * the rollout (labelled), holding its region passes and each of its targets' steps.
   */
  function timelineRows(d) {
    const targets = d.targets || [];
    const steps = stepsByStart(d);
    const rows = [];
    const own = steps.filter((s) => !targetOf(s.name, targets));
    if (own.length) {
      rows.push({ kind: 'band', label: 'Deploy', band: 0 });
      own.forEach((s) => rows.push({ kind: 'step', step: s, band: 0 }));
    }
    const waves = (d.waves && d.waves.length) ? d.waves
      : [{ name: '', targets: targets.map((t) => t.name) }];
    const placed = new Set();
    waves.forEach((w, i) => {
      const band = i + 1;
      const label = waves.length > 1 || w.name
        ? 'Wave ' + (i + 1) + '/' + waves.length + (w.name ? ': ' + w.name : '') : 'Targets';
      rows.push({ kind: 'band', label, band, wave: i + 1 });
      for (const p of (d.passes || []).filter((p) => p.targets.some((t) => w.targets.includes(t)))) {
        rows.push({ kind: 'pass', pass: p, band });
      }
      for (const name of w.targets) {
        placed.add(name);
        steps.filter((s) => targetOf(s.name, targets) === name)
          .forEach((s) => rows.push({ kind: 'step', step: s, band }));
      }
    });
    // Targets no wave names (a rollback's, a target added since): after the waves.
    const rest = steps.filter((s) => targetOf(s.name, targets) && !placed.has(targetOf(s.name, targets)));
    rest.forEach((s) => rows.push({ kind: 'step', step: s, band: waves.length + 1 }));
    return rows;
  }

  /**
   * One horizontal bar per step on a shared time axis (x from the first start to the last
   * end), coloured by status; a step that runs grows until now and says for how long. Rows
   * are grouped in labelled bands, one per wave, with the region passes that deployed it.
   */
  function drawTimeline(d) {
    const picture = $('timeline');
    const rows = timelineRows(d);
    const hasSteps = rows.some((r) => r.kind === 'step');
    $('timeline-empty').hidden = hasSteps;
    const now = Date.now();
    const span = (r) => {
      if (r.kind === 'step') {
        const start = Date.parse(r.step.started_at);
        return { start, end: Math.max(stepEnd(r.step, d, now), start) };
      }
      if (r.kind === 'pass' && r.pass.started_at) {
        const start = Date.parse(r.pass.started_at);
        const end = r.pass.finished_at ? Date.parse(r.pass.finished_at)
          : (TERMINAL.includes(d.status) && d.finished_at ? Date.parse(d.finished_at) : now);
        return { start, end: Math.max(end, start) };
      }
      return null;
    };
    const spans = rows.map(span);
    // An interruption's span counts too: a deploy resumed elsewhere has a gap to show.
    const marks = (d.interruptions || []).flatMap((i) => [i.interrupted_at, i.recovered_at, i.resumed_at])
      .filter((t) => t).map((t) => ({ start: Date.parse(t), end: Date.parse(t) }));
    const known = spans.filter((s) => s).concat(hasSteps ? marks : []);
    const t0 = known.length ? Math.min(...known.map((s) => s.start)) : 0;
    const t1 = known.length ? Math.max(...known.map((s) => s.end)) : 0;
    const total = Math.max(t1 - t0, 1);
    const label = 280, chart = 600, row = 22, top = 24, pad = 8;
    const width = label + chart + pad * 2;
    const height = hasSteps ? top + rows.length * row + pad : 0;
    picture.setAttribute('width', width);
    picture.setAttribute('height', height);
    picture.setAttribute('viewBox', '0 0 ' + width + ' ' + height);
    const nodes = [];
    if (!hasSteps) { picture.replaceChildren(); return; }
    rows.forEach((r, i) => {
      if (r.band % 2 === 1) nodes.push(svg('rect', { class: 'band', x: 0, y: top + i * row, width, height: row }));
    });
    for (let i = 0; i <= 4; i++) {
      const x = label + (chart * i) / 4;
      nodes.push(svg('line', { class: 'axis', x1: x, x2: x, y1: top - 6, y2: height - pad }));
      nodes.push(svg('text', { class: 'tick', x, y: top - 10, 'text-anchor': i === 4 ? 'end' : 'middle' },
        '+' + duration(Math.round((total * i) / 4))));
    }
    const bar = (s, cls, y, attrs) => {
      const x = Math.min(label + ((s.start - t0) / total) * chart, label + chart - 2);
      const w = Math.max(((s.end - s.start) / total) * chart, 2);
      return svg('rect', Object.assign({ class: 'bar ' + cls, x, y: y + 4, width: w, height: row - 8, rx: 3 }, attrs || {}));
    };
    const short = (text, max) => (text.length > max ? text.slice(0, max - 1) + '…' : text);
    rows.forEach((r, i) => {
      const y = top + i * row;
      const text = (x, content, cls) => svg('text', { x, y: y + row / 2 + 4, class: cls }, content);
      if (r.kind === 'band') {
        nodes.push(svg('g', { class: 'wave', 'data-wave': r.wave || null }, text(pad, r.label, 'band-label')));
      } else if (r.kind === 'pass') {
        const p = r.pass;
        const tip = 'region ' + p.region + ' (' + p.mode + ') — ' + p.status +
          (p.executor_id ? ' on ' + p.executor_id : '') + '\n' + p.targets.join(', ');
        nodes.push(svg('g', { class: 'pass', 'data-pass': p.id },
          svg('title', {}, tip),
          text(pad + 10, short('region ' + p.region + ' pass' + (p.mode === 'rollback' ? ' (rollback)' : '') +
            (p.executor_id ? ' · ' + p.executor_id : ''), 40), 'pass-label'),
          spans[i] ? bar(spans[i], 'pass-bar ' + statusClass(p.status === 'PENDING' ? 'PENDING' : p.status), y) : null));
      } else {
        const s = r.step;
        const running = isRunning(s, d);
        const elapsed = duration(spans[i].end - spans[i].start);
        const tip = s.name + ' — ' + (running ? 'running for ' + elapsed : s.status + ', ' + elapsed) +
          (s.attempts > 1 ? ', ' + s.attempts + ' attempts' : '') + (s.error ? '\n' + s.error : '');
        nodes.push(svg('g', { 'data-step': i, class: 'step' + (running ? ' running' : '') },
          svg('title', {}, tip),
          text(pad + 10, short(s.name, running ? 30 : 40)),
          bar(spans[i], barClass(s, d), y, running ? { 'data-since': s.started_at } : null),
          running ? svg('text', { class: 'elapsed', x: label - 6, y: y + row / 2 + 4, 'text-anchor': 'end', 'data-since': s.started_at },
            elapsed) : null));
      }
    });
    nodes.push(...interruptionMarks(d, t0, total, label, chart, top, height - pad));
    picture.replaceChildren(...nodes);
  }

  /**
   * The interruptions of a deploy over its timeline: a hatched span from when the lost
   * worker was last heard from to when the deploy was resumed (its recovery marked), named
   * and explained in its tooltip, so the gap between the steps reads as what it was.
   */
  function interruptionMarks(d, t0, total, label, chart, y0, y1) {
    const at = (t) => Math.min(Math.max(label + ((t - t0) / total) * chart, label), label + chart);
    return (d.interruptions || []).map((i) => {
      const recovered = Date.parse(i.recovered_at);
      const from = i.interrupted_at ? Date.parse(i.interrupted_at) : recovered;
      const to = i.resumed_at ? Date.parse(i.resumed_at) : recovered;
      const x = at(from);
      const tip = [
        i.interruption ? i.interrupted_at + ' ' + i.interruption : null,
        i.recovered_at + ' ' + i.recovery,
        i.resumed_by ? i.resumed_at + ' resumed by worker ' + i.resumed_by : 'not resumed yet',
      ].filter((line) => line).join('\n');
      return svg('g', { class: 'interruption', 'data-recovered-at': i.recovered_at },
        svg('title', {}, tip),
        svg('rect', { class: 'interruption-span', x, y: y0 - 6, width: Math.max(at(to) - x, 2), height: y1 - y0 + 6 }),
        svg('line', { class: 'recovery', x1: at(recovered), x2: at(recovered), y1: y0 - 6, y2: y1 }),
        svg('text', { class: 'interruption-label', x: x + 2, y: y0 + 6 }, 'interrupted'));
    });
  }

  /** The pane of `target`'s output ('' for the deploy's own), made when first needed. */
  function outputPane(target) {
    const box = $('output');
    for (const pane of box.children) {
      if (pane.getAttribute('data-output-target') === target) return pane.querySelector('pre');
    }
    const pane = el('details', { open: '', class: 'pane', 'data-output-target': target },
      el('summary', {}, target ? 'Target ' + target : 'Deploy'), el('pre', {}));
    box.append(pane);
    return pane.querySelector('pre');
  }

  /** Appends what the deploy's commands printed since the last call, as text, per target. */
  async function showOutput(id, targets) {
    if (outputOf !== id) {
      outputOf = id;
      outputSeq = 0;
      $('output').replaceChildren();
    }
    for (;;) {
      const page = await api('GET', '/deploys/' + encodeURIComponent(id) + '/output?after=' + outputSeq + '&limit=1000');
      const lines = (page && page.lines) || [];
      for (const l of lines) {
        outputSeq = l.seq;
        const mark = l.stream === 'stderr' ? '!' : (l.stream === 'progress' ? '·' : '|');
        const pre = outputPane(targetOf(l.source, targets));
        const follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.append(el('span', { class: 'line ' + l.stream }, l.source + ' ' + mark + ' ' + l.line + '\n'));
        // Follows the output as it grows, unless the reader scrolled up to read.
        if (follow) pre.scrollTop = pre.scrollHeight;
      }
      if (lines.length < 1000) break;
    }
    $('output-empty').hidden = outputSeq > 0;
  }

  /** What each target runs now, for its row: the step and for how long. */
  function runningStepOf(target, d) {
    return (d.steps || []).find((s) => isRunning(s, d) && targetOf(s.name, d.targets || []) === target);
  }

  /** Keeps every "running for" figure growing between two reads of the API. */
  function tickElapsed() {
    const now = Date.now();
    for (const node of document.querySelectorAll('text.elapsed[data-since], span.elapsed[data-since]')) {
      node.textContent = duration(now - Date.parse(node.getAttribute('data-since')));
    }
  }

  /** A metric's `success` condition, from the deploy's effective descriptor ('' when unknown). */
  function conditionOf(d, metric) {
    const metrics = (((d.effective || {}).rollout || {}).analysis || {}).metrics || [];
    const found = metrics.find((m) => m.name === metric);
    return found && typeof found.success === 'string' ? found.success : '';
  }

  /**
   * The analysis (docs/analysis.md): one small chart per wave and metric, inline SVG: the
   * canary's measured values over the bake, each dot coloured by its outcome, the baseline
   * dashed, and the threshold (the condition's bound, computed by the server at each
   * measurement) in red; a condition without a single bound says so in the chart's title.
   */
  function drawAnalysis(d) {
    const taken = d.measurements || [];
    $('analysis-section').hidden = taken.length === 0;
    const groups = new Map();
    for (const m of taken) {
      const key = 'wave ' + m.wave + ' · ' + m.metric + (m.target ? ' · ' + m.target : '');
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(m);
    }
    const charts = [];
    for (const [key, ms] of groups) {
      const width = 320, height = 80, pad = 6;
      const condition = conditionOf(d, ms[0].metric);
      const values = ms.flatMap((m) => [m.value, m.baseline, m.threshold]).filter((v) => typeof v === 'number');
      const top = Math.max(...values, 0) || 1;
      const x = (i) => pad + (ms.length < 2 ? 0 : i * (width - 2 * pad) / (ms.length - 1));
      const y = (v) => height - pad - (v / top) * (height - 2 * pad);
      const line = (field, attrs) => {
        const points = ms.map((m, i) => (typeof m[field] === 'number' ? [x(i), y(m[field])] : null)).filter(Boolean);
        // One point is a level, drawn across the chart.
        if (points.length === 1) points.splice(0, 1, [pad, points[0][1]], [width - pad, points[0][1]]);
        return points.length ? svg('polyline', Object.assign({ points: points.map((p) => p.join(',')).join(' '), fill: 'none' }, attrs)) : null;
      };
      const bounded = ms.some((m) => typeof m.threshold === 'number');
      const title = 'condition ' + (condition ? '`' + condition + '`' : 'unknown') + (bounded
        ? ': the red line is its threshold at each measurement'
        : ': no threshold line, the condition is not one comparison of result with an expression over baseline and numbers (or no baseline was measured)');
      const dots = ms.map((m, i) => svg('circle', {
        cx: x(i), cy: typeof m.value === 'number' ? y(m.value) : height - pad, r: 3,
        class: 'measurement ' + m.outcome,
      }, svg('title', {}, m.at + ': ' + (m.value ?? '-') + (m.baseline != null ? ' (baseline ' + m.baseline + ')' : '') +
        (m.threshold != null ? ' (threshold ' + m.threshold + ')' : '') + ' ' + m.outcome + (m.detail ? ': ' + m.detail : ''))));
      charts.push(el('figure', { class: 'analysis-chart', 'data-metric': ms[0].metric, 'data-threshold': bounded ? 'yes' : 'no' },
        el('figcaption', { title }, key + ' (max ' + top + ')' + (bounded ? '' : ' · no threshold')),
        svg('svg', { width, height, viewBox: '0 0 ' + width + ' ' + height, role: 'img', 'aria-label': key },
          svg('title', {}, title),
          line('threshold', { class: 'threshold' }), line('baseline', { class: 'baseline' }), line('value', { class: 'canary' }), ...dots)));
    }
    $('analysis').replaceChildren(...charts);
  }

  async function showDeploy(id) {
    const d = await api('GET', '/deploys/' + encodeURIComponent(id));
    await showOutput(id, d.targets || []);
    $('deploy-id').textContent = d.id;
    $('deploy-facts').replaceChildren(...facts(d));
    $('deploy-actions').replaceChildren(...actionButtons(d));
    drawTimeline(d);
    drawAnalysis(d);
    replaceRows($('targets'), (d.targets || []).map((t) => {
      const running = runningStepOf(t.name, d);
      // A target the deploy ended before reaching was never started, not pending.
      const status = t.status === 'pending' && TERMINAL.includes(d.status) ? 'not started' : t.status;
      return el('tr', { 'data-target': t.name },
        el('td', {}, t.name), statusCell(status),
        el('td', {}, running ? el('span', { class: 'running-step' }, running.name.slice(t.name.length + 1).trim() + ', running for ',
          el('span', { class: 'elapsed', 'data-since': running.started_at }, duration(Date.now() - Date.parse(running.started_at)))) : ''),
        el('td', {}, t.detail || ''));
    }), 4);
    replaceRows($('approvals'), (d.approvals || []).map((a) => el('tr', {},
      el('td', {}, a.by), el('td', {}, a.decision), el('td', {}, a.reason || ''), el('td', {}, a.at))), 4);
    replaceRows($('steps'), stepsByStart(d).map((s) => el('tr', {},
      el('td', {}, s.name),
      // A step still running when its deploy ended is STOPPED (the server says so).
      statusCell(s.status),
      el('td', {}, s.attempts), el('td', {}, s.started_at),
      el('td', {}, s.finished_at ? duration(Date.parse(s.finished_at) - Date.parse(s.started_at))
        : (isRunning(s, d) ? el('span', { class: 'elapsed', 'data-since': s.started_at }, duration(Date.now() - Date.parse(s.started_at))) : '…')),
      el('td', {}, s.executor_id), el('td', {}, s.error || ''))), 7);
  }

  // ---- routing and refresh ---------------------------------------------------------------

  function currentDeploy() {
    return new URLSearchParams(location.hash.slice(1)).get('deploy');
  }

  /** Who the page speaks as: the token's name, role and scope (`GET /whoami`). */
  function showSignedIn() {
    const box = $('signed-in');
    if (!me) {
      box.replaceChildren();
      return;
    }
    box.replaceChildren('signed in as ', el('strong', {}, me.name),
      ' (' + me.role + (me.scope ? ', applications ' + me.scope : '') + ')');
  }

  async function refresh() {
    clearTimeout(timer);
    const deploy = currentDeploy();
    $('need-token').hidden = !!token;
    if (!token || !me) showSignedIn();
    $('overview').hidden = !token || !!deploy;
    $('deploy').hidden = !token || !deploy;
    if (!token) return;
    if (!busy) {
      busy = true;
      try {
        if (!me) {
          me = await api('GET', '/whoami');
          showSignedIn();
        }
        if (deploy) await showDeploy(deploy);
        else await showOverview();
        clearError();
        $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      } catch (e) {
        showError(e.message);
      } finally {
        busy = false;
      }
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  $('token-form').addEventListener('submit', (event) => {
    event.preventDefault();
    saveToken($('token-input').value);
    me = null;
    $('token-input').value = '';
    refresh();
  });

  $('forget-token').addEventListener('click', () => {
    me = null;
    saveToken('');
    refresh();
  });

  window.addEventListener('hashchange', () => {
    takeTokenFromFragment();
    refresh();
  });

  loadToken();
  takeTokenFromFragment();
  refresh();
  setInterval(tickElapsed, 1000);
})();
