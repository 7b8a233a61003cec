// The official Weave TypeScript SDK logging to the gateway as its trace
// server, unchanged: only WF_TRACE_SERVER_URL and WANDB_API_KEY point it
// there. Login, nested ops, a wrapOpenAI client whose completions (one a
// streamed chat completion, one a streamed response) go through the same
// gateway, a Dataset saved and read back, an Evaluation with a scorer,
// getCalls; then the trace service's roll-ups give, for every root and for
// the project, exactly the tokens the completions reported, each once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { baseURL, apiKey, v1, uniqueProject } from '../lib/gateway.mjs';

// What a user sets. HOME is a scratch directory because weave.login saves
// the key in ~/.netrc.
process.env.WF_TRACE_SERVER_URL = baseURL;
process.env.WANDB_API_KEY = apiKey;
process.env.HOME = fs.mkdtempSync(path.join(os.tmpdir(), 'weave-home-'));
fs.writeFileSync(path.join(process.env.HOME, '.netrc'), '', { mode: 0o600 });
const weave = await import('weave');
const { default: OpenAI } = await import('openai');

const project = uniqueProject('weave');
const auth = { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' };

async function post(route, body) {
  const res = await fetch(`${baseURL}${route}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
  const text = await res.text();
  assert.equal(res.status, 200, `${route} answered ${res.status}: ${text}`);
  return text;
}

async function streamQuery(body) {
  const text = await post('/calls/stream_query', { project_id: project.id, ...body });
  return text.split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l));
}

// eventually retries check until it returns true or the deadline passes:
// the SDK sends its batches, and the gateway writes its usage records,
// asynchronously.
async function eventually(what, check, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const last = await check();
    if (last === true) return;
    if (Date.now() > deadline) assert.fail(`${what}: ${JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

test('the Weave SDK logs to the gateway, and every token is counted once', async () => {
  await weave.login(apiKey);
  const client = await weave.init(project.id);

  // Every completion the code is given, by root: what the roll-ups must say.
  const want = new Map();
  let root = '';
  const count = (usage) => {
    const w = want.get(root) ?? { requests: 0, prompt: 0, completion: 0 };
    w.requests += 1;
    w.prompt += usage.prompt_tokens;
    w.completion += usage.completion_tokens;
    want.set(root, w);
  };
  const openai = weave.wrapOpenAI(new OpenAI({
    baseURL: v1, apiKey, maxRetries: 0, defaultHeaders: { 'Compat-Project': project.id },
  }));

  // Nested ops: answer → ask (twice, one streamed) → the wrapped client.
  const ask = weave.op(async function ask(question, stream) {
    if (!stream) {
      const res = await openai.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: question }] });
      count(res.usage);
      return res.choices[0].message.content;
    }
    const chunks = await openai.chat.completions.create({ model: 'demo', stream: true, messages: [{ role: 'user', content: question }] });
    let text = '';
    for await (const chunk of chunks) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) count(chunk.usage);
    }
    return text;
  });
  const answer = weave.op(async function answer(question) {
    const a = await ask(question, false);
    const b = await ask(`${question} again`, true);
    return `${a} / ${b}`;
  });
  root = 'answer';
  const said = await answer('What is a gateway?');
  assert.ok(said.length > 3, 'the op returned the completions');

  // A streamed Responses API call. The SDK logs its output as
  // {responses:[…]}, the response of response.created completed by the
  // later events, with no id at the top: the fold reads the one response.
  const respond = weave.op(async function respond(question) {
    const events = await openai.responses.create({ model: 'demo', input: question, stream: true });
    let text = '';
    for await (const ev of events) {
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed') {
        count({ prompt_tokens: ev.response.usage.input_tokens, completion_tokens: ev.response.usage.output_tokens });
      }
    }
    return text;
  });
  root = 'respond';
  const responded = await respond('What is a response?');
  assert.ok(responded.length > 3, 'the op returned the streamed response');
  assert.equal(want.get('respond')?.requests, 1, 'the stream ended with response.completed');

  // A Dataset saved and read back.
  // The Dataset keeps (and marks) the row objects it is given: give it
  // copies.
  const rows = [{ question: 'one', expected: 'x' }, { question: 'two', expected: 'y' }, { question: 'three', expected: 'z' }];
  const dataset = new weave.Dataset({ name: 'questions', description: 'three questions', rows: rows.map((r) => ({ ...r })) });
  const ref = await dataset.save();
  const loaded = await client.get(ref);
  assert.equal(loaded.length, rows.length);
  const back = [];
  for await (const row of loaded) back.push({ question: row.question, expected: row.expected });
  assert.deepEqual(back, rows);

  // An Evaluation whose model calls the gateway, with a scorer.
  const model = weave.op(async function model({ datasetRow }) {
    const res = await openai.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: datasetRow.question }] });
    count(res.usage);
    return res.choices[0].message.content;
  });
  const nonEmpty = weave.op(({ modelOutput }) => ({ non_empty: modelOutput.length > 0 }), { name: 'nonEmpty' });
  const evaluation = new weave.Evaluation({ id: 'questions-eval', dataset, scorers: [nonEmpty] });
  root = 'evaluation';
  const summary = await evaluation.evaluate({ model });
  assert.equal(summary.nonEmpty.non_empty.true_count, rows.length, JSON.stringify(summary));

  await client.waitForBatchProcessing();

  // getCalls reads back what was logged.
  const roots = await client.getCalls({ trace_roots_only: true });
  const byOp = (c, name) => c.op_name.includes(`/${name}:`) || c.op_name === name;
  const answerRoot = roots.find((c) => byOp(c, 'answer'));
  const respondRoot = roots.find((c) => byOp(c, 'respond'));
  const evalRoot = roots.find((c) => c.op_name.includes('Evaluation.evaluate'));
  assert.ok(answerRoot && respondRoot && evalRoot, `roots: ${roots.map((c) => c.op_name).join(', ')}`);
  assert.equal(answerRoot.output, said);
  assert.equal(respondRoot.output, responded);
  const rootIds = new Map([['answer', answerRoot], ['respond', respondRoot], ['evaluation', evalRoot]]);

  // The gateway's call of each completion is folded into the SDK's: once
  // the usage writer has run, every completion is one call, the SDK's,
  // carrying the gateway's attributes.
  const completions = [...want.values()].reduce((n, w) => n + w.requests, 0);
  // The SDK's calls of the wrapped client, and the gateway's calls that
  // did not fold (op openai.responses.create), if any.
  const isLLM = (c) => c.op_name.includes('openai.chat.completions.create') || c.op_name.includes('responses.create') ||
    Array.isArray(c.output?.responses);
  await eventually('the gateway calls fold into the SDK calls', async () => {
    const calls = await streamQuery({ filter: { op_names: [] } });
    const llm = calls.filter(isLLM);
    const folded = llm.filter((c) => c.attributes?.weave?.source === 'js-sdk' && c.attributes?.gateway?.backend);
    return (llm.length === completions && folded.length === completions) || { llm: llm.length, folded: folded.length, completions };
  });
  const llm = (await streamQuery({})).filter(isLLM);
  for (const c of llm) {
    const gw = c.attributes.gateway;
    // A streamed response's output is {responses:[response]}.
    const out = c.output.responses?.length === 1 ? c.output.responses[0] : c.output;
    assert.equal(gw.key_name, 'demo', JSON.stringify(gw));
    assert.equal(gw.served_model, 'demo');
    assert.ok(gw.request_id && gw.call_id && gw.completion_id === out.id, JSON.stringify(gw));
    // The fold's key is the completion's id and its date, which the SDK
    // logs as the backend set it: the reply's "created" (a response's
    // "created_at"), or, reduced from a stream, its chunks' (events').
    const created = out.object === 'response' ? out.created_at : out.created;
    assert.ok(Number.isInteger(created) && created > 1.7e9, JSON.stringify(c.output));
  }
  assert.deepEqual(
    llm.map((c) => (c.output.responses ? `stream of ${c.output.responses.map((r) => r.object)}` : c.output.object)).sort(),
    ['chat.completion', 'chat.completion', 'chat.completion', 'chat.completion', 'chat.completion.chunk', 'stream of response'],
    'four completions, one stream and one streamed response, as the SDK logs them',
  );

  // Every root's roll-up is exactly its completions' tokens, once: in the
  // root's own summary as /calls/stream_query gives it (the SDK's, which
  // holds its descendants'), in /trace/usage and in /calls/usage.
  const projectWant = { requests: 0, prompt: 0, completion: 0 };
  for (const [name, w] of want) {
    const r = rootIds.get(name);
    const [listed] = await streamQuery({ filter: { call_ids: [r.id] } });
    const s = listed.summary.usage.demo;
    // The SDK sums a response's usage as the Responses API names it.
    assert.deepEqual(
      { requests: s.requests, prompt: (s.prompt_tokens ?? 0) + (s.input_tokens ?? 0), completion: (s.completion_tokens ?? 0) + (s.output_tokens ?? 0) },
      w,
      `summary of root ${name}: ${JSON.stringify(s)}`,
    );
    const body = JSON.parse(await post('/trace/usage', { project_id: project.id, filter: { trace_ids: [r.trace_id] } }));
    const got = body.call_usage[r.id].demo;
    assert.deepEqual(
      { requests: got.requests, prompt: got.prompt_tokens, completion: got.completion_tokens, total: got.total_tokens },
      { ...w, total: w.prompt + w.completion },
      `root ${name}`,
    );
    const calls = JSON.parse(await post('/calls/usage', { project_id: project.id, call_ids: [r.id] }));
    assert.deepEqual(calls.call_usage[r.id].demo, got, `/calls/usage of ${name}`);
    assert.deepEqual(calls.unfinished_call_ids, []);
    projectWant.requests += w.requests;
    projectWant.prompt += w.prompt;
    projectWant.completion += w.completion;
  }

  // The project: the sum of every call's own usage (a call's roll-up
  // minus its children's) is the tokens of every completion, once; and
  // the roots' roll-ups add up to it.
  const all = JSON.parse(await post('/trace/usage', { project_id: project.id }));
  const rollups = await streamQuery({ filter: { trace_roots_only: true } });
  const sum = { requests: 0, prompt: 0, completion: 0 };
  for (const r of rollups) {
    const u = all.call_usage[r.id]?.demo;
    if (!u) continue;
    sum.requests += u.requests;
    sum.prompt += u.prompt_tokens;
    sum.completion += u.completion_tokens;
  }
  assert.deepEqual(sum, projectWant, 'the project');
  assert.deepEqual(all.unfinished_call_ids, []);

  // /calls/query_stats counts what stream_query lists.
  const stats = JSON.parse(await post('/calls/query_stats', { project_id: project.id }));
  assert.equal(stats.count, (await streamQuery({})).length);
});
