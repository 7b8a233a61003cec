// Time ranges and the aggregation of usage-API pages into what the charts
// and tables show. Pure functions: no DOM, no fetch.

// RANGES maps each range the page offers to a bucket width the usage API
// allows (1m, 1h, 1d), its length in seconds, and the number of buckets,
// the current one included. The bucket counts are within the API's page
// limit for the width, so one page usually holds the range.
export const RANGES = {
  '1h': { width: '1m', step: 60, buckets: 60, limit: 1440 },
  '24h': { width: '1h', step: 3600, buckets: 24, limit: 168 },
  '7d': { width: '1h', step: 3600, buckets: 168, limit: 168 },
  '30d': { width: '1d', step: 86400, buckets: 30, limit: 31 },
};

// GROUPS maps each grouping the page offers to the usage API's group_by
// value and the result field that names the group.
export const GROUPS = {
  project: { param: 'project_id', field: 'project_id', label: 'team/project' },
  model: { param: 'model', field: 'model', label: 'model' },
  key: { param: 'api_key_id', field: 'api_key_id', label: 'API key' },
  endpoint: { param: 'endpoint', field: 'endpoint', label: 'endpoint' },
  status: { param: 'status', field: 'status', label: 'outcome' },
};

// NO_MODEL names the group of requests refused before a model was
// resolved (an unknown model, a body that could not be read): their
// model is empty.
export const NO_MODEL = '(no model)';

// STATUS_LABELS are what the page calls each outcome of the usage API's
// group_by=status.
export const STATUS_LABELS = {
  complete: 'complete',
  client_closed: 'client closed',
  stream_broken: 'broken off by the backend',
  client_error: 'client error (4xx)',
  server_error: 'gateway or backend error (5xx)',
};

// groupName is the name a usage result shows under in a grouping: never
// empty, so that no row reads as a blank.
export function groupName(result, group) {
  const value = result[GROUPS[group].field];
  if (group === 'model' && (value === '' || value === null || value === undefined)) return NO_MODEL;
  if (group === 'status') return STATUS_LABELS[value] ?? String(value ?? '(none)');
  if (value === null || value === undefined) return '(none)';
  return value === '' ? '(empty)' : value;
}

// ENDPOINTS are every endpoint the gateway meters. The page asks the usage
// API for all of them (its endpoints= parameter), so that embeddings count
// in its totals too; /v1/organization/usage/completions alone counts the
// text-generation endpoints only, as OpenAI's does.
export const ENDPOINTS = ['chat.completions', 'completions', 'embeddings', 'responses'];

// rangeStart returns the start_time (unix seconds) of a range: the start of
// the bucket that makes the range end with the bucket now is in. Buckets
// are aligned to UTC multiples of their width, as the usage API aligns
// them.
export function rangeStart(range, nowSeconds) {
  const r = RANGES[range];
  return (Math.floor(nowSeconds / r.step) - r.buckets + 1) * r.step;
}

function emptyTotals() {
  return { input: 0, output: 0, cached: 0, requests: 0, total: 0 };
}

function addResult(t, r) {
  t.input += r.input_tokens ?? 0;
  t.output += r.output_tokens ?? 0;
  t.cached += r.input_cached_tokens ?? 0;
  t.requests += r.num_model_requests ?? 0;
  t.total += (r.input_tokens ?? 0) + (r.output_tokens ?? 0);
}

// aggregate turns the buckets of a usage-API answer grouped by group (a
// GROUPS key) into:
//   - starts: each bucket's start_time;
//   - groups: per group its name, totals over the range (input, output,
//     cached, requests, total = input + output tokens) and tokens per
//     bucket (series), by total tokens descending then name;
//   - requests: requests per bucket, all groups together;
//   - totals: the range's totals.
export function aggregate(buckets, group) {
  const starts = buckets.map((b) => b.start_time);
  const groups = new Map();
  const requests = new Array(buckets.length).fill(0);
  const totals = emptyTotals();
  buckets.forEach((b, i) => {
    for (const r of b.results ?? []) {
      const name = groupName(r, group);
      if (!groups.has(name)) groups.set(name, { name, ...emptyTotals(), series: new Array(buckets.length).fill(0) });
      const g = groups.get(name);
      addResult(g, r);
      addResult(totals, r);
      g.series[i] += (r.input_tokens ?? 0) + (r.output_tokens ?? 0);
      requests[i] += r.num_model_requests ?? 0;
    }
  });
  const sorted = [...groups.values()].sort((a, b) => b.total - a.total || a.name.localeCompare(b.name));
  return { starts, groups: sorted, requests, totals };
}

// bucketLabel formats a bucket's start for a chart axis, in local time.
export function bucketLabel(startSeconds, range) {
  const d = new Date(startSeconds * 1000);
  const two = (n) => String(n).padStart(2, '0');
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  switch (range) {
    case '1h':
    case '24h':
      return hm;
    case '7d':
      return `${d.toLocaleDateString('en-US', { weekday: 'short' })} ${hm}`;
    default:
      return d.toLocaleDateString('en-US', { month: 'short', day: 'numeric' });
  }
}

// outcomes sums the buckets of a usage-API answer grouped by status
// (group_by=status) over the range: every request by outcome (num_requests
// counts refusals that reached no model too), the error rates, and the
// tokens of the streams cut short, which are what was streamed before the
// client left or the backend broke off. Gateway or backend errors (5xx)
// include the streams a backend broke off.
export function outcomes(buckets) {
  const o = {
    requests: 0,
    complete: 0,
    clientErrors: 0,
    serverErrors: 0,
    streamsBroken: 0,
    clientClosed: 0,
    clientClosedTokens: 0,
    streamsBrokenTokens: 0,
  };
  for (const b of buckets) {
    for (const r of b.results ?? []) {
      const n = r.num_requests ?? r.num_model_requests ?? 0;
      const tokens = (r.input_tokens ?? 0) + (r.output_tokens ?? 0);
      o.requests += n;
      switch (r.status) {
        case 'complete':
          o.complete += n;
          break;
        case 'client_error':
          o.clientErrors += n;
          break;
        case 'client_closed':
          o.clientClosed += n;
          o.clientClosedTokens += tokens;
          break;
        case 'stream_broken':
          o.streamsBroken += n;
          o.serverErrors += n;
          o.streamsBrokenTokens += tokens;
          break;
        default:
          // server_error, and any outcome a newer gateway adds: counted
          // as a failure rather than hidden.
          o.serverErrors += n;
      }
    }
  }
  const rate = (n) => (o.requests > 0 ? n / o.requests : NaN);
  o.errors = o.clientErrors + o.serverErrors;
  o.errorRate = rate(o.errors);
  o.clientErrorRate = rate(o.clientErrors);
  o.serverErrorRate = rate(o.serverErrors);
  return o;
}

// outcomesByModel sums the buckets of a usage-API answer grouped by model
// and status (group_by=model,status) into outcomes per model, sorted by
// name: { model, ...outcomes }.
export function outcomesByModel(buckets) {
  const byModel = new Map();
  for (const b of buckets) {
    for (const r of b.results ?? []) {
      const name = groupName(r, 'model');
      if (!byModel.has(name)) byModel.set(name, []);
      byModel.get(name).push(r);
    }
  }
  return [...byModel.entries()]
    .sort((a, b) => a[0].localeCompare(b[0]))
    .map(([model, results]) => ({ model, ...outcomes([{ results }]) }));
}

// PAGE_SIZE is how many rows a page of the usage table shows.
export const PAGE_SIZE = 20;

// pageRows keeps the groups whose name contains query (ignoring case and
// surrounding spaces; an empty query keeps all) and returns the page-th
// page (from 0, clamped to the pages there are) of size rows:
// { rows, page, pages, matched }. There is always at least one page.
export function pageRows(groups, query, page, size = PAGE_SIZE) {
  const q = String(query ?? '').trim().toLowerCase();
  const matched = q === '' ? groups : groups.filter((g) => g.name.toLowerCase().includes(q));
  const pages = Math.max(1, Math.ceil(matched.length / size));
  const p = Math.min(Math.max(0, Math.trunc(Number(page) || 0)), pages - 1);
  return { rows: matched.slice(p * size, (p + 1) * size), page: p, pages, matched: matched.length };
}
