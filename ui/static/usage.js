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
};

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
  const field = GROUPS[group].field;
  const starts = buckets.map((b) => b.start_time);
  const groups = new Map();
  const requests = new Array(buckets.length).fill(0);
  const totals = emptyTotals();
  buckets.forEach((b, i) => {
    for (const r of b.results ?? []) {
      const name = r[field] ?? '(none)';
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
