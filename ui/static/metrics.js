// Parsing of the Prometheus text exposition format and the summaries the
// dashboard shows from GET /metrics. Pure functions: no DOM, no fetch.

import { NO_MODEL } from './usage.js';

// parseValue reads a sample value, including Prometheus' spellings of the
// special floats.
function parseValue(s) {
  switch (s) {
    case '+Inf':
    case 'Inf':
      return Infinity;
    case '-Inf':
      return -Infinity;
    case 'NaN':
      return NaN;
  }
  return Number(s);
}

// parseLabels reads `{a="x",b="y"}` starting at text[i] === '{' and returns
// the labels and the index just past the closing brace.
function parseLabels(text, i) {
  const labels = {};
  i++; // '{'
  for (;;) {
    while (text[i] === ' ' || text[i] === ',') i++;
    if (text[i] === '}') return [labels, i + 1];
    const eq = text.indexOf('=', i);
    if (eq < 0) throw new Error('label without value');
    const name = text.slice(i, eq).trim();
    i = eq + 1;
    while (text[i] === ' ') i++;
    if (text[i] !== '"') throw new Error('label value not quoted');
    i++;
    let value = '';
    for (;;) {
      const c = text[i];
      if (c === undefined) throw new Error('unterminated label value');
      if (c === '"') {
        i++;
        break;
      }
      if (c === '\\') {
        const n = text[i + 1];
        value += n === 'n' ? '\n' : n;
        i += 2;
        continue;
      }
      value += c;
      i++;
    }
    labels[name] = value;
  }
}

// parsePrometheus parses the text format into a Map from metric name
// (histogram series keep their _bucket, _sum and _count suffixes) to a list
// of {labels, value}. Comments, blank lines and lines it cannot read are
// skipped, so one odd line never hides the rest.
export function parsePrometheus(text) {
  const out = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    try {
      let i = 0;
      while (i < line.length && line[i] !== '{' && line[i] !== ' ' && line[i] !== '\t') i++;
      const name = line.slice(0, i);
      let labels = {};
      if (line[i] === '{') [labels, i] = parseLabels(line, i);
      const [value] = line.slice(i).trim().split(/\s+/);
      const v = parseValue(value);
      if (name === '' || value === undefined || (Number.isNaN(v) && value !== 'NaN')) continue;
      if (!out.has(name)) out.set(name, []);
      out.get(name).push({ labels, value: v });
    } catch {
      // An unreadable line: skip it.
    }
  }
  return out;
}

// histogramQuantile returns the q-quantile (0 ≤ q ≤ 1) of a histogram
// given as cumulative buckets [{le, count}] sorted by le, the last with
// le = +Inf, exactly as PromQL's histogram_quantile does: linear
// interpolation within the bucket the rank falls in, the lowest bucket
// starting at 0 (when its bound is positive), and the highest finite bound
// when the rank falls in the +Inf bucket. It returns NaN without
// observations.
export function histogramQuantile(q, buckets) {
  if (Number.isNaN(q)) return NaN;
  if (q < 0) return -Infinity;
  if (q > 1) return Infinity;
  const n = buckets.length;
  if (n < 2 || buckets[n - 1].le !== Infinity) return NaN;
  // Counts must not decrease; scrapes taken mid-update can make them, and
  // PromQL fixes that the same way.
  const counts = [];
  let max = 0;
  for (const b of buckets) {
    max = Math.max(max, b.count);
    counts.push(max);
  }
  const total = counts[n - 1];
  if (total === 0) return NaN;
  let rank = q * total;
  let b = counts.findIndex((c, i) => i < n - 1 && c >= rank);
  if (b < 0) b = n - 1;
  if (b === n - 1) return buckets[n - 2].le;
  if (b === 0 && buckets[0].le <= 0) return buckets[0].le;
  let start = 0;
  const end = buckets[b].le;
  let count = counts[b];
  if (b > 0) {
    start = buckets[b - 1].le;
    count -= counts[b - 1];
    rank -= counts[b - 1];
  }
  return start + (end - start) * (rank / count);
}

// histogramBuckets sums the _bucket series of a histogram over every
// label set that keep(labels) accepts, by le, and returns the cumulative
// buckets sorted by le.
export function histogramBuckets(families, name, keep = () => true) {
  const byLe = new Map();
  for (const s of families.get(name + '_bucket') ?? []) {
    if (!keep(s.labels)) continue;
    const le = parseValue(s.labels.le);
    byLe.set(le, (byLe.get(le) ?? 0) + s.value);
  }
  return [...byLe.entries()].sort((a, b) => a[0] - b[0]).map(([le, count]) => ({ le, count }));
}

// QUANTILES are the percentiles the dashboard shows.
export const QUANTILES = [0.5, 0.9, 0.99];

function percentiles(buckets) {
  const out = { count: buckets.length ? buckets[buckets.length - 1].count : 0 };
  for (const q of QUANTILES) out['p' + Math.round(q * 100)] = histogramQuantile(q, buckets);
  return out;
}

// isError tells which statuses count as errors: everything but 2xx.
export function isError(status) {
  const code = Number(status);
  return !(code >= 200 && code < 300);
}

// modelName is the name a model label shows under: requests refused
// before a model was resolved carry an empty one.
export function modelName(label) {
  return label === undefined || label === '' ? NO_MODEL : label;
}

// summarize works out what the dashboard shows from parsed metrics:
// request counts by status and model with the error rate (the share of
// non-2xx answers), latency and time-to-first-token percentiles overall
// and by model, and the streams in flight. All counts are since the
// gateway started. Requests refused before a model was resolved are
// counted under NO_MODEL.
export function summarize(families) {
  const requests = families.get('tollgate_requests_total') ?? [];
  const byStatus = new Map();
  const byModel = new Map();
  const model = (name) => {
    if (!byModel.has(name)) byModel.set(name, { model: name, requests: 0, errors: 0, client: 0, server: 0 });
    return byModel.get(name);
  };
  let total = 0;
  let errors = 0;
  for (const s of requests) {
    const status = s.labels.status ?? '';
    byStatus.set(status, (byStatus.get(status) ?? 0) + s.value);
    const m = model(modelName(s.labels.model));
    m.requests += s.value;
    total += s.value;
    if (isError(status)) {
      m.errors += s.value;
      errors += s.value;
    }
    const code = Number(status);
    if (code >= 400 && code < 500) m.client += s.value;
    if (code >= 500) m.server += s.value;
  }
  const modelNames = new Set(byModel.keys());
  for (const h of ['tollgate_request_duration_seconds_bucket', 'tollgate_time_to_first_token_seconds_bucket']) {
    for (const s of families.get(h) ?? []) modelNames.add(modelName(s.labels.model));
  }
  const models = [...modelNames].sort().map((name) => {
    const m = model(name);
    const only = (labels) => modelName(labels.model) === name;
    return {
      ...m,
      errorRate: m.requests > 0 ? m.errors / m.requests : NaN,
      latency: percentiles(histogramBuckets(families, 'tollgate_request_duration_seconds', only)),
      ttft: percentiles(histogramBuckets(families, 'tollgate_time_to_first_token_seconds', only)),
    };
  });
  const inFlight = families.get('tollgate_streams_in_flight') ?? [];
  return {
    requests: total,
    errors,
    errorRate: total > 0 ? errors / total : NaN,
    byStatus: [...byStatus.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([status, count]) => ({ status, count })),
    models,
    latency: percentiles(histogramBuckets(families, 'tollgate_request_duration_seconds')),
    ttft: percentiles(histogramBuckets(families, 'tollgate_time_to_first_token_seconds')),
    streamsInFlight: inFlight.reduce((sum, s) => sum + s.value, 0),
  };
}
