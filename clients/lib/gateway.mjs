// What every client test needs of the gateway under test: where it is, the
// key, and direct reads of its usage API to check that usage is exact.
import assert from 'node:assert/strict';

export const baseURL = process.env.TOLLGATE_URL;
export const apiKey = process.env.TOLLGATE_KEY;
if (!baseURL || !apiKey) {
  throw new Error('TOLLGATE_URL and TOLLGATE_KEY must name a running gateway (cmd/tollgate/clients_test.go sets them)');
}
export const v1 = `${baseURL}/v1`;

// uniqueProject gives each test file a Compat-Project of its own, so that
// usage totals are exact while files run in parallel against one gateway.
export function uniqueProject(area) {
  const suffix = `${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
  const team = "clients";
  const project = `${area}-${suffix}`;
  return { team, project, id: `${team}/${project}` };
}

// usageTotals reads the usage API for one project, summing every bucket,
// and retries until `want` matches or the deadline passes: records are
// written asynchronously, within usage.flush_interval (1 s in the example).
// With cached, the totals also sum input_cached_tokens.
export async function usageTotals(project, { want, endpoint = 'completions', timeoutMs = 15000, cached = false } = {}) {
  const deadline = Date.now() + timeoutMs;
  const start = Math.floor(Date.now() / 1000) - 3600;
  for (;;) {
    const url = `${v1}/organization/usage/${endpoint}?start_time=${start}&bucket_width=1d&group_by=project_id&limit=31`;
    const res = await fetch(url, { headers: { Authorization: `Bearer ${apiKey}` } });
    assert.equal(res.status, 200, `usage API answered ${res.status}: ${await res.clone().text()}`);
    const page = await res.json();
    const totals = { input_tokens: 0, output_tokens: 0, num_model_requests: 0 };
    if (cached) totals.input_cached_tokens = 0;
    for (const bucket of page.data) {
      for (const r of bucket.results) {
        if (r.project_id !== project) continue;
        totals.input_tokens += r.input_tokens;
        if (cached) totals.input_cached_tokens += r.input_cached_tokens;
        totals.output_tokens += r.output_tokens;
        totals.num_model_requests += r.num_model_requests;
      }
    }
    const matches = want === undefined || Object.entries(want).every(([k, v]) => totals[k] === v);
    if (matches || Date.now() > deadline) return totals;
    await new Promise((r) => setTimeout(r, 200));
  }
}
