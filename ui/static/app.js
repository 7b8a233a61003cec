// The dashboard: sign-in, the controls, and rendering what the gateway's
// endpoints return. Every fetch of one refresh runs in parallel.

import { Api, AuthError, HTTPError } from './api.js';
import { Charts } from './charts.js';
import { costsByProject, fmtUSD, monthStart, spendSince } from './costs.js';
import { $, el, fmtInt, fmtPercent, fmtSeconds, fmtTime, setText } from './dom.js';
import { parsePrometheus, summarize } from './metrics.js';
import { renderTrace } from './trace.js';
import { GROUPS, PAGE_SIZE, RANGES, aggregate, bucketLabel, outcomes, outcomesByModel, pageRows, rangeStart } from './usage.js';

// KEY_STORAGE is where the key is kept: session storage, so it lives as
// long as the tab and is never written to disk as a cookie would be.
const KEY_STORAGE = 'tollgate.apiKey';

// REFRESH_MS is how often a visible page refreshes itself.
const REFRESH_MS = 30000;

// TOP is how many projects and keys the top lists show.
const TOP = 10;

// readParams reads the view from the URL fragment, so that a view can be
// bookmarked or shared (the key is never part of it).
function readParams() {
  const h = new URLSearchParams(location.hash.slice(1));
  const range = RANGES[h.get('range')] ? h.get('range') : '24h';
  const group = GROUPS[h.get('group')] ? h.get('group') : 'project';
  return { range, group, project: h.get('project') ?? '', trace: h.get('trace') ?? '' };
}

function writeParams(p) {
  const h = new URLSearchParams({ range: p.range, group: p.group });
  if (p.project) h.set('project', p.project);
  if (p.trace) h.set('trace', p.trace);
  history.replaceState(null, '', `#${h}`);
}

function emptyRow(tbody, columns, text) {
  tbody.replaceChildren(el('tr', {}, el('td', { colspan: columns, class: 'muted', text })));
}

class App {
  constructor() {
    this.api = null;
    this.charts = new Charts();
    this.params = readParams();
    this.generation = 0;
    this.traceGeneration = 0;
    this.timer = null;
    // The usage table's groups, its search and its page: paging and
    // searching redraw the table without fetching again.
    this.usageGroups = [];
    this.usageSearch = '';
    this.usagePage = 0;
  }

  start() {
    $('sign-in-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const input = $('key-input');
      const key = input.value.trim();
      input.value = '';
      if (key) this.signIn(key);
    });
    $('sign-out-button').addEventListener('click', () => this.signOut(''));
    $('refresh-button').addEventListener('click', () => this.refresh());
    $('range-select').addEventListener('change', (e) => this.setParams({ range: e.target.value }));
    $('group-select').addEventListener('change', (e) => this.setParams({ group: e.target.value }));
    $('usage-search').addEventListener('input', (e) => {
      this.usageSearch = e.target.value;
      this.usagePage = 0;
      this.renderUsageTable();
    });
    $('usage-prev').addEventListener('click', () => {
      this.usagePage--;
      this.renderUsageTable();
    });
    $('usage-next').addEventListener('click', () => {
      this.usagePage++;
      this.renderUsageTable();
    });
    $('trace-form').addEventListener('submit', (e) => {
      e.preventDefault();
      this.showTrace($('trace-project').value.trim(), $('trace-id').value.trim());
    });
    window.addEventListener('hashchange', () => {
      this.params = readParams();
      this.syncControls();
      if (this.api) this.refresh();
    });
    this.syncControls();
    const key = sessionStorage.getItem(KEY_STORAGE);
    if (key) this.signIn(key);
    else this.showSignIn('');
  }

  // syncControls shows the view's parameters in the controls.
  syncControls() {
    $('range-select').value = this.params.range;
    $('group-select').value = this.params.group;
    $('trace-project').value = this.params.project;
    $('trace-id').value = this.params.trace;
  }

  showSignIn(message) {
    $('sign-in').hidden = false;
    $('dashboard').hidden = true;
    $('controls').hidden = true;
    $('sign-in-error').textContent = message;
    $('key-input').focus();
  }

  signIn(key) {
    sessionStorage.setItem(KEY_STORAGE, key);
    this.api = new Api(key);
    $('sign-in').hidden = true;
    $('dashboard').hidden = false;
    $('controls').hidden = false;
    clearInterval(this.timer);
    this.timer = setInterval(() => {
      if (document.visibilityState === 'visible' && $('dashboard').dataset.state !== 'loading') this.refresh();
    }, REFRESH_MS);
    this.refresh();
  }

  signOut(message) {
    sessionStorage.removeItem(KEY_STORAGE);
    this.api = null;
    this.generation++;
    this.traceGeneration++;
    clearInterval(this.timer);
    this.charts.destroyAll();
    this.usageGroups = [];
    this.usageSearch = '';
    this.usagePage = 0;
    $('usage-search').value = '';
    for (const id of ['org-projects', 'usage-table', 'model-outcomes-table', 'model-metrics-table', 'latency-table', 'top-projects', 'top-keys', 'budgets', 'backends-table', 'trace-tree', 'recent-traces']) {
      $(id).replaceChildren();
    }
    $('dashboard').dataset.state = 'idle';
    this.showSignIn(message);
  }

  setParams(change) {
    this.params = { ...this.params, ...change };
    this.usagePage = 0;
    writeParams(this.params);
    this.refresh();
  }

  // refresh reloads every panel: usage (four groupings: the view's, by
  // project, by key and by outcome), /readyz,
  // /metrics and the selected trace, all fetched at once. Each panel
  // renders as its answer arrives; the dashboard's data-state turns
  // "ready" (or "error") when all are done.
  async refresh() {
    if (!this.api) return;
    const gen = ++this.generation;
    const api = this.api;
    const { range, group, project, trace } = this.params;
    const dash = $('dashboard');
    dash.dataset.state = 'loading';
    const start = rangeStart(range, Math.floor(Date.now() / 1000));
    const usage = api.usage(range, group, start);
    const projects = group === 'project' ? usage : api.usage(range, 'project', start);
    const keys = group === 'key' ? usage : api.usage(range, 'key', start);
    const statuses = group === 'status' ? usage : api.usage(range, 'status', start);
    const modelStatuses = api.usage(range, ['model', 'status'], start);
    // Costs come by UTC day: from the range's first day, or the month's
    // first if earlier, for the projects' spend this month.
    const now = Math.floor(Date.now() / 1000);
    const firstDay = Math.floor(start / 86400) * 86400;
    const month = monthStart(now);
    const costs = api.costs(Math.min(firstDay, month));
    const current = () => gen === this.generation;
    const panels = [
      usage.then((b) => current() && this.renderUsage(aggregate(b, group), range, group, start)),
      projects.then((b) => current() && this.renderTop('top-projects', 'top-project', aggregate(b, 'project'), true)),
      keys.then((b) => current() && this.renderTop('top-keys', 'top-key', aggregate(b, 'key'), false)),
      statuses.then((b) => current() && this.renderOutcomes(outcomes(b))),
      modelStatuses.then((b) => current() && this.renderModelOutcomes(outcomesByModel(b))),
      api.budgets().then((b) => current() && this.renderBudgets(b)),
      costs.then((b) => current() && this.renderCosts(b, firstDay)),
      Promise.all([api.projects(), costs]).then(([p, b]) => current() && this.renderProjects(p, spendSince(b, month))),
      api
        .ready()
        .then((r) => current() && this.renderBackends(r))
        .catch((e) => {
          // With admin_listen set, the dashboard is served on the admin
          // listener, and /readyz only on the client listener.
          if (!(e instanceof HTTPError && e.status === 404)) throw e;
          if (!current()) return;
          setText('backends-healthy', '?');
          setText('ready-state', '/readyz is not served on this listener');
          emptyRow($('backends-table'), 5, 'Backend states come from /readyz, which this listener does not serve (admin_listen is set): open /readyz on the client listener.');
        }),
      api
        .metrics()
        .then((t) => current() && this.renderMetrics(summarize(parsePrometheus(t))))
        .catch((e) => {
          // /metrics names every team's counts, so the gateway answers it
          // to admin keys (or its metrics token) only: a team key sees why
          // these panels are empty, not an error.
          if (!(e instanceof HTTPError && e.status === 403)) throw e;
          if (current()) this.renderMetricsRefused();
        }),
      this.loadTrace(project, trace),
    ];
    const results = await Promise.allSettled(panels);
    if (!current()) return;
    const failures = results.filter((r) => r.status === 'rejected').map((r) => r.reason);
    const auth = failures.find((e) => e instanceof AuthError);
    if (auth) {
      this.signOut(`The gateway refused the key: ${auth.message}`);
      return;
    }
    const banner = $('dashboard-error');
    banner.hidden = failures.length === 0;
    banner.textContent = failures.map((e) => e.message).join(' · ');
    setText('last-updated', `updated ${new Date().toLocaleTimeString('en-US')}`);
    dash.dataset.state = failures.length ? 'error' : 'ready';
  }

  renderUsage(agg, range, group, start) {
    const labels = agg.starts.map((s) => bucketLabel(s, range));
    this.charts.tokens($('tokens-chart'), labels, agg.groups);
    this.charts.requests($('requests-chart'), labels, agg.requests);
    const t = agg.totals;
    setText('total-tokens', fmtInt(t.total), t.total);
    setText('total-input', fmtInt(t.input), t.input);
    setText('total-output', fmtInt(t.output), t.output);
    setText('total-cached', fmtInt(t.cached), t.cached);
    setText('total-requests', fmtInt(t.requests), t.requests);
    const win = $('range-window');
    win.textContent = `since ${fmtTime(start)} · ${RANGES[range].width} buckets`;
    win.dataset.start = String(start);
    win.dataset.width = RANGES[range].width;
    setText('tokens-chart-title', `stacked by ${GROUPS[group].label}`);
    setText('usage-group-label', GROUPS[group].label);
    this.usageGroups = agg.groups;
    this.renderUsageTable();
  }

  // renderUsageTable shows the page of the usage table's groups that the
  // search and the page select: every group of the range is fetched (the
  // API's pages followed), and paged here.
  renderUsageTable() {
    const tbody = $('usage-table');
    const view = pageRows(this.usageGroups, this.usageSearch, this.usagePage, PAGE_SIZE);
    this.usagePage = view.page;
    tbody.dataset.page = String(view.page);
    tbody.dataset.pages = String(view.pages);
    tbody.dataset.matched = String(view.matched);
    setText('usage-page', `page ${fmtInt(view.page + 1)} of ${fmtInt(view.pages)}`);
    setText(
      'usage-count',
      this.usageSearch.trim() === '' ? `${fmtInt(this.usageGroups.length)} rows` : `${fmtInt(view.matched)} of ${fmtInt(this.usageGroups.length)} rows match`,
    );
    $('usage-prev').disabled = view.page === 0;
    $('usage-next').disabled = view.page >= view.pages - 1;
    if (view.rows.length === 0) {
      emptyRow(tbody, 6, this.usageGroups.length === 0 ? 'No usage in this range.' : 'No row matches the search.');
      return;
    }
    tbody.replaceChildren(
      ...view.rows.map((g) =>
        el(
          'tr',
          { 'data-testid': 'usage-row', 'data-group': g.name },
          el('td', { text: g.name }),
          el('td', { class: 'num', 'data-testid': 'usage-input', text: fmtInt(g.input) }),
          el('td', { class: 'num', 'data-testid': 'usage-output', text: fmtInt(g.output) }),
          el('td', { class: 'num', 'data-testid': 'usage-cached', text: fmtInt(g.cached) }),
          el('td', { class: 'num strong', 'data-testid': 'usage-total', text: fmtInt(g.total) }),
          el('td', { class: 'num', 'data-testid': 'usage-requests', text: fmtInt(g.requests) }),
        ),
      ),
    );
  }

  // renderOutcomes shows the range's requests by outcome (the usage API's
  // group_by=status): the error rate split into client errors (4xx) and
  // gateway or backend errors (5xx), and the streams clients closed, with
  // the tokens streamed to them before they left.
  renderOutcomes(o) {
    setText('error-rate', fmtPercent(o.errorRate), o.errorRate);
    setText('error-detail', `${fmtInt(o.errors)} of ${fmtInt(o.requests)} requests in the range failed`);
    setText('client-errors', fmtInt(o.clientErrors), o.clientErrors);
    setText('client-error-rate', fmtPercent(o.clientErrorRate), o.clientErrorRate);
    setText('server-errors', fmtInt(o.serverErrors), o.serverErrors);
    setText('server-error-rate', fmtPercent(o.serverErrorRate), o.serverErrorRate);
    setText('streams-broken', fmtInt(o.streamsBroken), o.streamsBroken);
    setText('client-closed', fmtInt(o.clientClosed), o.clientClosed);
    setText('client-closed-tokens', fmtInt(o.clientClosedTokens), o.clientClosedTokens);
  }

  // renderModelOutcomes shows the range's requests per model by outcome.
  renderModelOutcomes(models) {
    const tbody = $('model-outcomes-table');
    if (models.length === 0) {
      emptyRow(tbody, 6, 'No requests in this range.');
      return;
    }
    tbody.replaceChildren(
      ...models.map((m) =>
        el(
          'tr',
          { 'data-testid': 'model-outcome-row', 'data-name': m.model },
          el('td', { text: m.model }),
          el('td', { class: 'num', 'data-testid': 'model-outcome-requests', text: fmtInt(m.requests) }),
          el('td', { class: 'num', 'data-testid': 'model-outcome-4xx', text: fmtInt(m.clientErrors) }),
          el('td', { class: 'num', 'data-testid': 'model-outcome-5xx', text: fmtInt(m.serverErrors) }),
          el('td', { class: 'num', 'data-testid': 'model-outcome-closed', text: fmtInt(m.clientClosed) }),
          el('td', { class: 'num', 'data-testid': 'model-outcome-error-rate', 'data-value': m.errorRate, text: fmtPercent(m.errorRate) }),
        ),
      ),
    );
  }

  // renderTop lists the groups with the most tokens, with their share of
  // the range's tokens. Project names open the project's recent traces.
  renderTop(tbodyId, rowId, agg, projects) {
    const tbody = $(tbodyId);
    if (agg.groups.length === 0) {
      emptyRow(tbody, 4, 'No usage in this range.');
      return;
    }
    const total = agg.totals.total;
    tbody.replaceChildren(
      ...agg.groups.slice(0, TOP).map((g) => {
        const name = projects
          ? el('button', { type: 'button', class: 'link', title: 'Show recent traces', text: g.name, onclick: () => this.showTrace(g.name, '') })
          : g.name;
        const share = total > 0 ? g.total / total : 0;
        return el(
          'tr',
          { 'data-testid': rowId, 'data-name': g.name },
          el('td', {}, name),
          el('td', { class: 'num strong', 'data-testid': `${rowId}-tokens`, text: fmtInt(g.total) }),
          el('td', {}, el('meter', { min: 0, max: 1, value: share }), ` ${fmtPercent(share)}`),
          el('td', { class: 'num', 'data-testid': `${rowId}-requests`, text: fmtInt(g.requests) }),
        );
      }),
    );
  }

  // renderBudgets lists each token budget with what its window has spent.
  // Spend is what the gateway has recorded (requests in flight are not in
  // it yet), so it can trail the limiter by the requests under way.
  renderBudgets(answer) {
    const tbody = $('budgets');
    const budgets = Array.isArray(answer?.data) ? answer.data : [];
    if (budgets.length === 0) {
      emptyRow(tbody, 5, 'No token budget is configured for your teams.');
      return;
    }
    tbody.replaceChildren(
      ...budgets.map((b) => {
        const name = budgetName(b);
        const share = b.budget > 0 ? Math.min(b.used / b.budget, 1) : 0;
        return el(
          'tr',
          { 'data-testid': 'budget', 'data-name': name },
          el('td', { text: name }),
          el('td', { text: b.window }),
          el('td', { class: 'num strong', 'data-testid': 'budget-used', text: fmtInt(b.used) }),
          el('td', { class: 'num', 'data-testid': 'budget-limit', text: fmtInt(b.budget) }),
          el('td', {}, el('meter', { min: 0, max: 1, low: 0.8, high: 0.95, optimum: 0, value: share }), ` ${fmtPercent(b.budget > 0 ? b.used / b.budget : 0)}`),
        );
      }),
    );
  }

  // renderCosts shows the cost of the range's days (the costs API's daily
  // buckets from firstDay on) and charts each day's by project.
  renderCosts(buckets, firstDay) {
    const inRange = buckets.filter((b) => b.start_time >= firstDay);
    const c = costsByProject(inRange);
    setText('total-cost', fmtUSD(c.total), c.total);
    setText('cost-window', `since ${fmtTime(firstDay)} (UTC days), at the configured prices`);
    this.charts.costs($('costs-chart'), c.starts.map((s) => bucketLabel(s, '30d')), c.groups);
  }

  // renderProjects lists the Admin API's projects (null for a key that is
  // not an admin key) with their keys, redacted as the API shows them, and
  // their spend this month against their spend limit.
  renderProjects(projects, spent) {
    const tbody = $('org-projects');
    $('org-note').hidden = projects !== null;
    if (!projects || projects.length === 0) {
      emptyRow(tbody, 5, projects ? 'No project: create one with the Admin API.' : 'Sign in with an admin key to see projects.');
      return;
    }
    tbody.replaceChildren(
      ...projects.map((p) => {
        const spend = spent.get(p.id) ?? 0;
        const limit = p.spendLimit ? p.spendLimit.threshold_amount / 100 : null;
        const share = limit ? spend / limit : NaN;
        return el(
          'tr',
          { 'data-testid': 'org-project', 'data-id': p.id },
          el('td', {}, el('strong', { text: p.name }), el('br'), el('span', { class: 'muted', text: p.id })),
          el('td', { 'data-testid': 'org-project-keys', text: p.keys.map((k) => k.redacted_value).join(' · ') || '–' }),
          el('td', { class: 'num strong', 'data-testid': 'org-project-spend', 'data-value': spend, text: fmtUSD(spend) }),
          el('td', { class: 'num', 'data-testid': 'org-project-limit', text: limit === null ? 'none' : fmtUSD(limit) }),
          el('td', {}, limit === null ? '' : el('meter', { min: 0, max: 1, low: 0.8, high: 0.95, optimum: 0, value: Math.min(share, 1) }), limit === null ? '' : ` ${fmtPercent(share)}`),
        );
      }),
    );
  }

  // renderBackends shows /readyz: each backend's state, its time to first
  // token (a moving average, absent before its first request) and its
  // requests in flight, each in its own column. A "state" string wins over
  // healthy; other plain fields a newer gateway adds are listed under
  // details as they come.
  renderBackends(ready) {
    const backends = Array.isArray(ready?.backends) ? ready.backends : [];
    const healthy = backends.filter((b) => b.healthy === true).length;
    setText('backends-healthy', `${healthy} / ${backends.length}`, healthy);
    setText('ready-state', ready?.ready ? 'ready: every model has a healthy backend' : 'NOT ready: a model has no healthy backend');
    const tbody = $('backends-table');
    if (backends.length === 0) {
      emptyRow(tbody, 5, 'No backends reported.');
      return;
    }
    const known = new Set(['name', 'healthy', 'in_flight', 'state', 'ttft_ms']);
    tbody.replaceChildren(
      ...backends.map((b) => {
        const state = typeof b.state === 'string' && b.state !== '' ? b.state : b.healthy ? 'healthy' : 'ejected';
        const extra = Object.entries(b)
          .filter(([k, v]) => !known.has(k) && v !== null && typeof v !== 'object')
          .map(([k, v]) => `${k.replaceAll('_', ' ')}: ${typeof v === 'number' ? v.toLocaleString('en-US', { maximumFractionDigits: 2 }) : v}`)
          .join(' · ');
        const ttft = typeof b.ttft_ms === 'number' && b.ttft_ms > 0 ? b.ttft_ms / 1000 : NaN;
        return el(
          'tr',
          { 'data-testid': 'backend-row', 'data-name': String(b.name ?? '') },
          el('td', { text: String(b.name ?? '') }),
          el('td', {}, el('span', { class: `badge ${state === 'healthy' ? 'ok' : b.healthy ? 'running' : 'error'}`, 'data-testid': 'backend-state', text: state })),
          el('td', { class: 'num', 'data-testid': 'backend-ttft', 'data-value': Number.isNaN(ttft) ? null : String(b.ttft_ms), text: fmtSeconds(ttft) }),
          el('td', { class: 'num', 'data-testid': 'backend-in-flight', text: fmtInt(b.in_flight ?? 0) }),
          el('td', { class: 'muted', 'data-testid': 'backend-details', text: extra }),
        );
      }),
    );
  }

  // renderMetricsRefused empties the panels only /metrics fills, saying why.
  renderMetricsRefused() {
    for (const prefix of ['latency', 'ttft']) {
      for (const p of ['p50', 'p90', 'p99']) setText(`${prefix}-${p}`, '—');
    }
    setText('streams-in-flight', '—');
    const why = 'The gateway\'s metrics (all teams, since it started) need an admin key.';
    setText('status-counts', why);
    emptyRow($('model-metrics-table'), 5, why);
    emptyRow($('latency-table'), 6, why);
  }

  // renderMetrics shows what only /metrics knows, since the gateway
  // started: requests by model and status (those refused before a model
  // was resolved under "(no model)"), and latency percentiles.
  renderMetrics(m) {
    for (const [prefix, h] of [['latency', m.latency], ['ttft', m.ttft]]) {
      for (const p of ['p50', 'p90', 'p99']) setText(`${prefix}-${p}`, fmtSeconds(h[p]), h[p]);
    }
    setText('streams-in-flight', fmtInt(m.streamsInFlight), m.streamsInFlight);
    setText('status-counts', m.byStatus.length ? `By status: ${m.byStatus.map((s) => `${s.status} × ${fmtInt(s.count)}`).join(' · ')}` : 'No requests yet.');
    const rows = m.models.filter((x) => x.requests > 0);
    const mt = $('model-metrics-table');
    if (rows.length === 0) emptyRow(mt, 5, 'No requests since the gateway started.');
    else
      mt.replaceChildren(
        ...rows.map((x) =>
          el(
            'tr',
            { 'data-testid': 'model-metrics-row', 'data-name': x.model },
            el('td', { text: x.model }),
            el('td', { class: 'num', text: fmtInt(x.requests) }),
            el('td', { class: 'num', text: fmtInt(x.client) }),
            el('td', { class: 'num', text: fmtInt(x.server) }),
            el('td', { class: 'num', 'data-testid': 'model-error-rate', 'data-value': x.errorRate, text: fmtPercent(x.errorRate) }),
          ),
        ),
      );
    const timed = m.models.filter((x) => x.latency.count > 0 || x.ttft.count > 0);
    const lt = $('latency-table');
    if (timed.length === 0) emptyRow(lt, 6, 'No timings yet.');
    else
      lt.replaceChildren(
        ...timed.map((x) =>
          el(
            'tr',
            { 'data-testid': 'latency-row', 'data-name': x.model },
            el('td', { text: x.model }),
            ...['p50', 'p90', 'p99'].map((p) => el('td', { class: 'num', text: fmtSeconds(x.latency[p]) })),
            el('td', { class: 'num', text: fmtSeconds(x.ttft.p50) }),
            el('td', { class: 'num', text: fmtSeconds(x.ttft.p99) }),
          ),
        ),
      );
    this.charts.latency($('latency-chart'), timed);
  }

  // showTrace selects a project and trace (an empty trace lists the
  // project's recent traces) and loads it.
  showTrace(project, trace) {
    this.params = { ...this.params, project, trace };
    writeParams(this.params);
    $('trace-project').value = project;
    $('trace-id').value = trace;
    this.loadTrace(project, trace).catch((e) => {
      if (e instanceof AuthError) this.signOut(`The gateway refused the key: ${e.message}`);
    });
  }

  // loadTrace shows one trace's call tree with each call's usage rolled
  // up over its descendants: the calls from /calls/stream_query and the
  // usage from /trace/usage, fetched together. Without a trace id it lists
  // the project's latest traces instead.
  async loadTrace(project, trace) {
    const gen = ++this.traceGeneration;
    const tree = $('trace-tree');
    const recent = $('recent-traces');
    const summary = $('trace-summary');
    const error = $('trace-error');
    error.textContent = '';
    if (!project) {
      tree.dataset.state = 'idle';
      return;
    }
    tree.dataset.state = 'loading';
    const api = this.api;
    try {
      if (!trace) {
        const roots = await api.recentTraces(project);
        if (gen !== this.traceGeneration) return;
        summary.hidden = true;
        tree.replaceChildren();
        recent.replaceChildren(
          el('p', { class: 'muted', text: roots.length ? `Latest traces of ${project}:` : `No traces in ${project}.` }),
          ...roots.map((c) =>
            el('button', {
              type: 'button',
              class: 'link trace-link',
              'data-testid': 'recent-trace',
              'data-trace-id': c.trace_id,
              text: `${fmtTime(c.started_at)} · ${c.display_name || c.op_name} · ${c.trace_id}`,
              onclick: () => this.showTrace(project, c.trace_id),
            }),
          ),
        );
        tree.dataset.state = 'ready';
        return;
      }
      const [calls, usage] = await Promise.all([api.calls(project, trace), api.traceUsage(project, trace)]);
      if (gen !== this.traceGeneration) return;
      recent.replaceChildren();
      if (calls.length === 0) {
        summary.hidden = true;
        tree.replaceChildren(el('p', { class: 'muted', text: `No calls with trace id ${trace} in ${project}.` }));
        tree.dataset.state = 'ready';
        return;
      }
      const total = renderTrace(tree, calls, usage);
      setText('trace-total-tokens', fmtInt(total.total), total.total);
      setText('trace-total-prompt', fmtInt(total.prompt), total.prompt);
      setText('trace-total-completion', fmtInt(total.completion), total.completion);
      setText('trace-total-requests', fmtInt(total.requests), total.requests);
      setText('trace-call-count', fmtInt(calls.length), calls.length);
      summary.hidden = false;
      tree.dataset.state = 'ready';
    } catch (e) {
      if (gen !== this.traceGeneration) return;
      if (e instanceof AuthError) throw e;
      error.textContent = e.message;
      summary.hidden = true;
      tree.replaceChildren();
      tree.dataset.state = 'error';
    }
  }
}

new App().start();

// budgetName names what a budget counts: its team, project and key, where
// an empty one counts every value together.
export function budgetName(b) {
  const team = b.team || 'all teams';
  const project = b.project ? `/${b.project}` : '';
  const key = b.key ? ` (key ${b.key})` : '';
  return `${team}${project}${key}`;
}
