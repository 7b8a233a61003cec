// Unit tests of the dashboard's pure modules, run by `node --test` (the Go
// test TestJavaScriptModules runs this file when node is installed).
import assert from 'node:assert/strict';
import test from 'node:test';

import { histogramBuckets, histogramQuantile, modelName, parsePrometheus, summarize } from '../static/metrics.js';
import { buildTree, callStatus, sumUsage } from '../static/trace.js';
import { ENDPOINTS, NO_MODEL, aggregate, groupName, outcomes, outcomesByModel, pageRows, rangeStart } from '../static/usage.js';

const exposition = `# HELP tollgate_requests_total Chat completion requests.
# TYPE tollgate_requests_total counter
tollgate_requests_total{backend="sim",model="demo",status="200"} 8
tollgate_requests_total{backend="sim",model="demo",status="500"} 2
tollgate_requests_total{backend="",model="we\\"ird\\\\name",status="404"} 1
# TYPE tollgate_request_duration_seconds histogram
tollgate_request_duration_seconds_bucket{model="demo",le="0.1"} 2
tollgate_request_duration_seconds_bucket{model="demo",le="0.5"} 6
tollgate_request_duration_seconds_bucket{model="demo",le="1"} 10
tollgate_request_duration_seconds_bucket{model="demo",le="+Inf"} 10
tollgate_request_duration_seconds_sum{model="demo"} 4.2
tollgate_request_duration_seconds_count{model="demo"} 10
tollgate_streams_in_flight 3
go_gc_duration_seconds{quantile="0.5"} NaN
this line is not a sample
`;

test('parsePrometheus reads labels, escapes and special values', () => {
  const f = parsePrometheus(exposition);
  assert.equal(f.get('tollgate_requests_total').length, 3);
  assert.deepEqual(f.get('tollgate_requests_total')[2].labels, { backend: '', model: 'we"ird\\name', status: '404' });
  assert.equal(f.get('tollgate_streams_in_flight')[0].value, 3);
  assert.ok(Number.isNaN(f.get('go_gc_duration_seconds')[0].value));
  assert.equal(histogramBuckets(f, 'tollgate_request_duration_seconds').at(-1).le, Infinity);
});

test('histogramQuantile interpolates as PromQL does', () => {
  const b = [
    { le: 0.1, count: 2 },
    { le: 0.5, count: 6 },
    { le: 1, count: 10 },
    { le: Infinity, count: 10 },
  ];
  const cases = [
    [0.5, 0.1 + 0.4 * (3 / 4)], // rank 5 in (0.1, 0.5]: 3 of its 4
    [0.1, 0.1 * (1 / 2)], // rank 1 in the first bucket, from 0
    [0.9, 0.5 + 0.5 * (3 / 4)],
    [1, 1],
    [0, 0],
  ];
  for (const [q, want] of cases) assert.ok(Math.abs(histogramQuantile(q, b) - want) < 1e-12, `q=${q}: ${histogramQuantile(q, b)} want ${want}`);
  // A rank in the +Inf bucket gives the highest finite bound.
  assert.equal(histogramQuantile(0.99, [{ le: 1, count: 1 }, { le: Infinity, count: 10 }]), 1);
  assert.ok(Number.isNaN(histogramQuantile(0.5, [{ le: 1, count: 0 }, { le: Infinity, count: 0 }])));
  assert.ok(Number.isNaN(histogramQuantile(0.5, [{ le: 1, count: 3 }])));
  assert.equal(histogramQuantile(-1, b), -Infinity);
  assert.equal(histogramQuantile(2, b), Infinity);
});

test('summarize counts errors and percentiles', () => {
  const s = summarize(parsePrometheus(exposition));
  assert.equal(s.requests, 11);
  assert.equal(s.errors, 3);
  assert.equal(s.errorRate, 3 / 11);
  assert.equal(s.streamsInFlight, 3);
  const demo = s.models.find((m) => m.model === 'demo');
  assert.equal(demo.server, 2);
  assert.equal(demo.errorRate, 0.2);
  assert.ok(Math.abs(s.latency.p50 - 0.4) < 1e-12);
  assert.equal(s.latency.count, 10);
  assert.ok(Number.isNaN(s.ttft.p50));
});

test('aggregate sums groups and buckets', () => {
  const buckets = [
    { start_time: 0, results: [{ input_tokens: 5, output_tokens: 1, input_cached_tokens: 2, num_model_requests: 1, project_id: 'a/x' }] },
    {
      start_time: 60,
      results: [
        { input_tokens: 10, output_tokens: 10, input_cached_tokens: 0, num_model_requests: 2, project_id: 'b/y' },
        { input_tokens: 1, output_tokens: 1, input_cached_tokens: 0, num_model_requests: 1, project_id: 'a/x' },
      ],
    },
  ];
  const a = aggregate(buckets, 'project');
  assert.deepEqual(a.starts, [0, 60]);
  assert.deepEqual(a.requests, [1, 3]);
  assert.deepEqual(a.totals, { input: 16, output: 12, cached: 2, requests: 4, total: 28 });
  assert.deepEqual(a.groups.map((g) => [g.name, g.total, g.series]), [['b/y', 20, [0, 20]], ['a/x', 8, [6, 2]]]);
});

test('aggregate by endpoint', () => {
  const buckets = [
    {
      start_time: 0,
      results: [
        { input_tokens: 9, output_tokens: 0, input_cached_tokens: 0, num_model_requests: 3, endpoint: 'embeddings' },
        { input_tokens: 4, output_tokens: 2, input_cached_tokens: 1, num_model_requests: 1, endpoint: 'chat.completions' },
      ],
    },
  ];
  const a = aggregate(buckets, 'endpoint');
  assert.deepEqual(a.groups.map((g) => [g.name, g.total, g.requests]), [['embeddings', 9, 3], ['chat.completions', 6, 1]]);
  assert.deepEqual(ENDPOINTS, ['chat.completions', 'completions', 'embeddings', 'responses']);
});

test('rangeStart ends the range with the current bucket', () => {
  assert.equal(rangeStart('1h', 7200 + 59), 7200 - 59 * 60);
  assert.equal(rangeStart('30d', 86400 * 40 + 5), 86400 * 11);
});

test('buildTree and sumUsage', () => {
  const roots = buildTree([
    { id: 'r', parent_id: null },
    { id: 'c1', parent_id: 'r' },
    { id: 'c2', parent_id: 'c1' },
    { id: 'orphan', parent_id: 'gone' },
  ]);
  assert.deepEqual(roots.map((n) => n.call.id), ['r', 'orphan']);
  assert.equal(roots[0].children[0].children[0].call.id, 'c2');
  const u = sumUsage({ a: { requests: 1, prompt_tokens: 2, completion_tokens: 3, total_tokens: 5 }, b: { requests: 1, prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
  assert.deepEqual(u, { requests: 2, prompt: 3, completion: 4, total: 7, models: ['a', 'b'] });
});

test('requests refused before a model was resolved are named, never empty', () => {
  const s = summarize(parsePrometheus(exposition + 'tollgate_requests_total{backend="",model="",status="401"} 4\n'));
  const none = s.models.find((m) => m.model === NO_MODEL);
  assert.ok(none, `models ${JSON.stringify(s.models.map((m) => m.model))}`);
  assert.equal(none.requests, 4);
  assert.equal(none.client, 4);
  assert.ok(s.models.every((m) => m.model !== ''));
  assert.equal(modelName(''), NO_MODEL);
  assert.equal(modelName('demo'), 'demo');
  assert.equal(groupName({ model: '' }, 'model'), NO_MODEL);
  assert.equal(groupName({ model: null }, 'model'), NO_MODEL);
  assert.equal(groupName({ project_id: 'a/x' }, 'project'), 'a/x');
  assert.equal(groupName({ status: 'client_closed' }, 'status'), 'client closed');
  const a = aggregate([{ start_time: 0, results: [{ input_tokens: 0, num_model_requests: 0, model: '' }] }], 'model');
  assert.deepEqual(a.groups.map((g) => g.name), [NO_MODEL]);
});

test('outcomes split errors into 4xx and 5xx and count client-closed streams with their tokens', () => {
  const buckets = [
    {
      start_time: 0,
      results: [
        { status: 'complete', num_requests: 6, num_model_requests: 6, input_tokens: 60, output_tokens: 30 },
        { status: 'client_error', num_requests: 2, num_model_requests: 0, input_tokens: 0, output_tokens: 0 },
        { status: 'client_closed', num_requests: 1, num_model_requests: 1, input_tokens: 8, output_tokens: 3 },
      ],
    },
    {
      start_time: 60,
      results: [
        { status: 'server_error', num_requests: 1, num_model_requests: 1, input_tokens: 0, output_tokens: 0 },
        { status: 'stream_broken', num_requests: 1, num_model_requests: 1, input_tokens: 5, output_tokens: 2 },
        { status: 'client_closed', num_requests: 1, num_model_requests: 1, input_tokens: 4, output_tokens: 1 },
      ],
    },
  ];
  const o = outcomes(buckets);
  assert.equal(o.requests, 12);
  assert.equal(o.complete, 6);
  assert.equal(o.clientErrors, 2);
  assert.equal(o.serverErrors, 2); // the 5xx and the stream the backend broke off
  assert.equal(o.streamsBroken, 1);
  assert.equal(o.clientClosed, 2);
  assert.equal(o.clientClosedTokens, 16);
  assert.equal(o.errors, 4);
  assert.equal(o.errorRate, 4 / 12);
  assert.equal(o.clientErrorRate, 2 / 12);
  assert.equal(o.serverErrorRate, 2 / 12);
  const none = outcomes([{ start_time: 0, results: [] }]);
  assert.equal(none.requests, 0);
  assert.equal(none.errors, 0);
  assert.ok(Number.isNaN(none.errorRate));
});

test('pageRows searches and pages', () => {
  const groups = Array.from({ length: 45 }, (_, i) => ({ name: `team${i % 3}/project-${String(i).padStart(2, '0')}` }));
  const first = pageRows(groups, '', 0, 20);
  assert.deepEqual([first.page, first.pages, first.matched, first.rows.length], [0, 3, 45, 20]);
  assert.equal(first.rows[0].name, 'team0/project-00');
  const last = pageRows(groups, '', 2, 20);
  assert.deepEqual(last.rows.map((g) => g.name), ['team1/project-40', 'team2/project-41', 'team0/project-42', 'team1/project-43', 'team2/project-44']);
  // Out-of-range pages clamp; an empty result still has one page.
  assert.equal(pageRows(groups, '', 99, 20).page, 2);
  assert.equal(pageRows(groups, '', -3, 20).page, 0);
  const team1 = pageRows(groups, '  TEAM1/ ', 0, 20);
  assert.equal(team1.matched, 15);
  assert.ok(team1.rows.every((g) => g.name.startsWith('team1/')));
  const nothing = pageRows(groups, 'nope', 4, 20);
  assert.deepEqual([nothing.page, nothing.pages, nothing.matched, nothing.rows.length], [0, 1, 0, 0]);
});

test('callStatus tells client-closed streams from errors', () => {
  const ended = { ended_at: '2025-01-01T00:00:01Z' };
  const cases = [
    [{ ...ended, exception: null, attributes: { status: 200 } }, 'ok', ''],
    [{ ...ended, exception: 'client closed the stream: broken pipe', attributes: { status: 200, incomplete: true } }, 'client closed', ''],
    [{ ...ended, exception: 'The client closed the connection', attributes: { status: 499 } }, 'client closed', ''],
    [{ ...ended, exception: 'upstream stream broken: EOF', attributes: { status: 200, incomplete: true } }, 'broken off', 'upstream stream broken: EOF'],
    [{ ...ended, exception: null, attributes: { status: 200, incomplete: true } }, 'broken off', 'the stream ended early'],
    [{ ...ended, exception: 'backend sim: status 500', attributes: { status: 502 } }, 'error', 'backend sim: status 500'],
    [{ exception: null, attributes: {} }, 'running', ''],
  ];
  for (const [call, text, error] of cases) {
    const st = callStatus(call);
    assert.equal(st.text, text, JSON.stringify(call));
    assert.equal(st.error, error, JSON.stringify(call));
  }
});

test('outcomesByModel splits outcomes per model, the unresolved one named', () => {
  const buckets = [
    {
      start_time: 0,
      results: [
        { model: 'demo', status: 'complete', num_requests: 3, input_tokens: 30, output_tokens: 3 },
        { model: 'demo', status: 'server_error', num_requests: 1, input_tokens: 0, output_tokens: 0 },
        { model: 'alpha', status: 'client_error', num_requests: 2, input_tokens: 0, output_tokens: 0 },
      ],
    },
    { start_time: 60, results: [{ model: 'demo', status: 'client_closed', num_requests: 1, input_tokens: 5, output_tokens: 2 }] },
  ];
  const got = outcomesByModel(buckets).map((m) => [m.model, m.requests, m.clientErrors, m.serverErrors, m.clientClosed, m.clientClosedTokens]);
  assert.deepEqual(got, [
    ['alpha', 2, 2, 0, 0, 0],
    ['demo', 5, 0, 1, 1, 7],
  ]);
  assert.equal(outcomesByModel([{ start_time: 0, results: [{ model: '', status: 'client_error', num_requests: 1 }] }])[0].model, NO_MODEL);
});

test('costsByProject sums daily costs by project, largest first', async () => {
  const { costsByProject, fmtUSD, monthStart, spendSince } = await import('../static/costs.js');
  const buckets = [
    { start_time: 100, results: [{ project_id: 'a', amount: { value: 0.5, currency: 'usd' } }] },
    { start_time: 200, results: [] },
    {
      start_time: 300,
      results: [
        { project_id: 'b', amount: { value: 2, currency: 'usd' } },
        { project_id: 'a', amount: { value: 0.25, currency: 'usd' } },
      ],
    },
  ];
  const c = costsByProject(buckets);
  assert.deepEqual(c.starts, [100, 200, 300]);
  assert.equal(c.total, 2.75);
  assert.deepEqual(c.groups.map((g) => [g.name, g.total, g.series]), [
    ['b', 2, [0, 0, 2]],
    ['a', 0.75, [0.5, 0, 0.25]],
  ]);
  assert.deepEqual([...spendSince(buckets, 200)], [['b', 2], ['a', 0.25]]);
  assert.equal(monthStart(Date.UTC(2025, 2, 14, 12) / 1000), Date.UTC(2025, 2, 1) / 1000);
  assert.equal(fmtUSD(0.0000123), '$0.000012');
  assert.equal(fmtUSD(1234.5), '$1,234.50');
  assert.equal(fmtUSD(0), '$0.00');
});
