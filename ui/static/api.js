// Calls to the gateway's own public endpoints, with the signed-in key.
// Everything the dashboard shows comes through here, so every number can
// also be had with curl and the same key.

import { ENDPOINTS, GROUPS, RANGES } from './usage.js';

// AuthError is a 401: the key is missing or wrong.
export class AuthError extends Error {}

// HTTPError is any other refused request.
export class HTTPError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// errorMessage extracts the server's message from an OpenAI-shaped
// ({"error":{"message"}}) or FastAPI-shaped ({"detail"}) error body.
function errorMessage(status, text) {
  try {
    const body = JSON.parse(text);
    if (body?.error?.message) return body.error.message;
    if (typeof body?.detail === 'string') return body.detail;
    if (Array.isArray(body?.detail)) return body.detail.map((d) => d.msg).join('; ');
  } catch {
    // Not JSON: fall through.
  }
  return `HTTP ${status}`;
}

export class Api {
  constructor(key) {
    this.key = key;
  }

  // request sends one request and returns the body as text. Statuses in
  // okStatuses (besides 2xx) are answers, not failures. credentials: 'omit'
  // keeps the browser from prompting for a password on the service API's
  // Basic challenge: the key goes in the Authorization header only.
  async request(path, { method = 'GET', body, accept = 'application/json', okStatuses = [] } = {}) {
    const headers = { Authorization: `Bearer ${this.key}`, Accept: accept };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit',
      cache: 'no-store',
    });
    const text = await res.text();
    if (!res.ok && !okStatuses.includes(res.status)) {
      const msg = errorMessage(res.status, text);
      if (res.status === 401) throw new AuthError(msg);
      throw new HTTPError(res.status, `${path}: ${msg}`);
    }
    return text;
  }

  // usage reads GET /v1/organization/usage/completions for a range and a
  // grouping (a GROUPS key, or a list of them), every endpoint counted,
  // following next_page, and returns every bucket.
  async usage(range, group, start) {
    const groupBy = [group].flat().map((g) => GROUPS[g].param).join(',');
    const r = RANGES[range];
    const buckets = [];
    let page = null;
    for (let i = 0; i < 100; i++) {
      const q = new URLSearchParams({
        start_time: String(start),
        bucket_width: r.width,
        limit: String(r.limit),
        group_by: groupBy,
        endpoints: ENDPOINTS.join(','),
      });
      if (page) q.set('page', page);
      const body = JSON.parse(await this.request(`/v1/organization/usage/completions?${q}`));
      buckets.push(...body.data);
      if (!body.has_more || !body.next_page) break;
      page = body.next_page;
    }
    return buckets;
  }

  // costs reads GET /v1/organization/costs from start (unix seconds) on,
  // by day and project, following next_page, and returns every bucket.
  async costs(start) {
    const buckets = [];
    let page = null;
    for (let i = 0; i < 100; i++) {
      const q = new URLSearchParams({ start_time: String(start), bucket_width: '1d', limit: '180', group_by: 'project_id' });
      if (page) q.set('page', page);
      const body = JSON.parse(await this.request(`/v1/organization/costs?${q}`));
      buckets.push(...body.data);
      if (!body.has_more || !body.next_page) break;
      page = body.next_page;
    }
    return buckets;
  }

  // projects lists the Admin API's active projects, each with its API
  // keys (redacted) and spend limit (null when none), following the
  // lists' pages; null when the key is not an admin key (403).
  async projects() {
    const all = [];
    let after = '';
    for (let i = 0; i < 100; i++) {
      const q = new URLSearchParams({ limit: '100' });
      if (after) q.set('after', after);
      const text = await this.request(`/v1/organization/projects?${q}`, { okStatuses: [403] });
      const body = JSON.parse(text);
      if (body.error) return null;
      all.push(...body.data);
      if (!body.has_more || !body.last_id) break;
      after = body.last_id;
    }
    return Promise.all(
      all.map(async (p) => {
        const base = `/v1/organization/projects/${encodeURIComponent(p.id)}`;
        const [keys, limit] = await Promise.all([
          this.request(`${base}/api_keys?limit=100`).then((t) => JSON.parse(t).data),
          this.request(`${base}/spend_limit`, { okStatuses: [404] }).then((t) => {
            const body = JSON.parse(t);
            return body.error ? null : body;
          }),
        ]);
        return { ...p, keys, spendLimit: limit };
      }),
    );
  }

  // ready reads GET /readyz, whose 503 (not every model has a healthy
  // backend) still lists the backends.
  async ready() {
    return JSON.parse(await this.request('/readyz', { okStatuses: [503] }));
  }

  // budgets reads GET /v1/tollgate/budgets: each token budget with its
  // spend in the current window, limited to the key's teams.
  async budgets() {
    return JSON.parse(await this.request('/v1/tollgate/budgets'));
  }

  // metrics reads GET /metrics as text.
  async metrics() {
    return this.request('/metrics', { accept: 'text/plain' });
  }

  // calls reads the calls of one trace from POST /calls/stream_query, JSON
  // Lines, oldest first.
  async calls(project, traceId) {
    const text = await this.request('/calls/stream_query', {
      method: 'POST',
      accept: 'application/jsonl',
      body: {
        project_id: project,
        filter: { trace_ids: [traceId] },
        sort_by: [{ field: 'started_at', direction: 'asc' }],
      },
    });
    return parseJSONLines(text);
  }

  // recentTraces lists the latest root calls of a project.
  async recentTraces(project, limit = 8) {
    const text = await this.request('/calls/stream_query', {
      method: 'POST',
      accept: 'application/jsonl',
      body: {
        project_id: project,
        filter: { trace_roots_only: true },
        sort_by: [{ field: 'started_at', direction: 'desc' }],
        limit,
      },
    });
    return parseJSONLines(text);
  }

  // traceUsage reads POST /trace/usage for one trace: each call's usage
  // rolled up over its descendants, by model.
  async traceUsage(project, traceId) {
    return JSON.parse(
      await this.request('/trace/usage', {
        method: 'POST',
        body: { project_id: project, filter: { trace_ids: [traceId] } },
      }),
    );
  }
}

// parseJSONLines parses one JSON value per non-empty line.
export function parseJSONLines(text) {
  return text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line));
}
