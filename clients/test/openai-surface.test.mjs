// The rest of the OpenAI surface through real SDKs: model lookup,
// embeddings (float and base64), legacy completions, the Responses API
// (plain, streamed and continued with previous_response_id), and the
// Vercel AI SDK's default provider, which speaks the Responses API. At the
// end the usage API must count exactly what the replies reported, per
// endpoint family: /usage/completions (chat, completions, responses) and
// /usage/embeddings.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';
import { v1, apiKey, uniqueProject, usageTotals } from '../lib/gateway.mjs';

const project = uniqueProject('surface');
const headers = { 'Compat-Project': project.id };
const client = new OpenAI({ baseURL: v1, apiKey, defaultHeaders: headers, maxRetries: 0 });

// What the replies reported, summed as the usage API sums them. Tests in
// a file run one after another, so the last one sees every count.
const generated = { num_model_requests: 0, input_tokens: 0, output_tokens: 0 };
// Embeddings usage results carry no output tokens, as OpenAI's.
const embedded = { num_model_requests: 0, input_tokens: 0 };

function count(usage, input, output) {
  assert.ok(Number.isInteger(input) && input > 0, `input tokens reported: ${JSON.stringify(usage)}`);
  assert.ok(Number.isInteger(output) && output >= 0, `output tokens reported: ${JSON.stringify(usage)}`);
  generated.num_model_requests += 1;
  generated.input_tokens += input;
  generated.output_tokens += output;
}

test('models.retrieve: a configured model, and 404 model_not_found', async () => {
  const model = await client.models.retrieve('demo');
  assert.equal(model.id, 'demo');
  assert.equal(model.object, 'model');
  assert.equal(model.owned_by, 'tollgate');
  const listed = [];
  for await (const m of client.models.list()) listed.push(m);
  assert.deepEqual(listed.find((m) => m.id === 'demo'), model, 'the same object as in the list');

  await assert.rejects(client.models.retrieve('no-such-model'), (err) => {
    assert.ok(err instanceof OpenAI.NotFoundError, `got ${err}`);
    assert.equal(err.code, 'model_not_found');
    return true;
  });
});

test('unknown /v1 paths and methods answer the OpenAI error shape', async () => {
  for (const [method, path, status] of [['GET', '/no-such-thing', 404], ['DELETE', '/models', 405], ['GET', '/embeddings', 405]]) {
    const res = await fetch(v1 + path, { method, headers: { Authorization: `Bearer ${apiKey}` } });
    assert.equal(res.status, status, `${method} ${path}`);
    const body = await res.json();
    assert.equal(typeof body.error?.message, 'string', `${method} ${path}: ${JSON.stringify(body)}`);
    assert.ok('type' in body.error && 'param' in body.error && 'code' in body.error);
    if (status === 405) assert.ok(res.headers.get('allow'), 'a 405 names the methods allowed');
  }
});

test('embeddings.create: float and base64 decode to the same vectors', async () => {
  const input = ['The quick brown fox', 'jumps over the lazy dog'];
  const asFloat = await client.embeddings.create({ model: 'demo', input, encoding_format: 'float' });
  assert.equal(asFloat.object, 'list');
  assert.equal(asFloat.model, 'demo');
  assert.equal(asFloat.data.length, 2);
  const dims = asFloat.data[0].embedding.length;
  assert.ok(dims > 0 && asFloat.data.every((d, i) => d.index === i && d.embedding.length === dims));
  assert.ok(asFloat.data[0].embedding.some((x, i) => x !== asFloat.data[1].embedding[i]), 'different inputs, different vectors');

  const asBase64 = await client.embeddings.create({ model: 'demo', input, encoding_format: 'base64' });
  for (const [i, d] of asBase64.data.entries()) {
    assert.equal(typeof d.embedding, 'string', 'base64 passes through as a string');
    const bytes = Buffer.from(d.embedding, 'base64');
    const decoded = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4));
    assert.deepEqual(decoded, asFloat.data[i].embedding.map(Math.fround), `vector ${i}`);
  }

  // Without encoding_format the SDK asks for base64 and decodes it itself.
  const byDefault = await client.embeddings.create({ model: 'demo', input });
  assert.deepEqual(byDefault.data.map((d) => d.embedding), asFloat.data.map((d) => d.embedding.map(Math.fround)));

  for (const r of [asFloat, asBase64, byDefault]) {
    assert.ok(r.usage.prompt_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
    embedded.num_model_requests += 1;
    embedded.input_tokens += r.usage.prompt_tokens;
  }
});

test('completions.create: plain, and streamed with and without usage', async () => {
  const plain = await client.completions.create({ model: 'demo', prompt: 'Once upon a time', max_tokens: 12 });
  assert.equal(plain.object, 'text_completion');
  assert.equal(plain.model, 'demo');
  assert.ok(plain.choices[0].text.length > 0, 'the completion has text');
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
  count(plain.usage, plain.usage.prompt_tokens, plain.usage.completion_tokens);

  const stream = await client.completions.create({
    model: 'demo', prompt: 'Stream a story', max_tokens: 12, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage;
  for await (const chunk of stream) {
    assert.equal(chunk.model, 'demo');
    if (chunk.usage) usage = chunk.usage;
    text += chunk.choices[0]?.text ?? '';
  }
  assert.ok(text.length > 0, 'the stream carried text');
  assert.ok(usage && usage.completion_tokens > 0, 'include_usage brought the usage chunk');
  count(usage, usage.prompt_tokens, usage.completion_tokens);

  // Unasked, the usage chunk is not shown, yet the stream is metered: its
  // unstreamed twin says at how much.
  const body = { model: 'demo', prompt: 'No usage please', max_tokens: 6 };
  const twin = await client.completions.create(body);
  count(twin.usage, twin.usage.prompt_tokens, twin.usage.completion_tokens);
  const quiet = await client.completions.create({ ...body, stream: true });
  let sawUsage = false;
  for await (const chunk of quiet) if (chunk.usage) sawUsage = true;
  assert.equal(sawUsage, false, 'no usage chunk when the client did not ask');
  count(twin.usage, twin.usage.prompt_tokens, twin.usage.completion_tokens);
});

test('responses.create: plain, streamed, and continued where the response lives', async () => {
  const first = await client.responses.create({ model: 'demo', input: 'Say hello' });
  assert.equal(first.object, 'response');
  assert.equal(first.status, 'completed');
  assert.equal(first.model, 'demo');
  assert.ok(first.output_text.length > 0, 'the response has text');
  count(first.usage, first.usage.input_tokens, first.usage.output_tokens);

  // The follow-up reaches the backend holding the first response: any
  // other would not know previous_response_id.
  const next = await client.responses.create({ model: 'demo', input: 'And again', previous_response_id: first.id });
  assert.equal(next.status, 'completed');
  assert.notEqual(next.id, first.id);
  count(next.usage, next.usage.input_tokens, next.usage.output_tokens);
  const fetched = await client.responses.retrieve(first.id);
  assert.equal(fetched.id, first.id);

  const stream = await client.responses.create({ model: 'demo', input: 'Stream it', stream: true });
  const types = [];
  let text = '';
  let completed;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.created') assert.equal(event.response.model, 'demo');
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.equal(types[0], 'response.created');
  assert.ok(types.includes('response.output_text.delta'), `events: ${types.join(', ')}`);
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(text.length > 0);
  assert.equal(completed.output_text ?? text, text, 'the deltas make the final text');
  count(completed.usage, completed.usage.input_tokens, completed.usage.output_tokens);

  const afterStream = await client.responses.create({ model: 'demo', input: 'Continue', previous_response_id: completed.id });
  count(afterStream.usage, afterStream.usage.input_tokens, afterStream.usage.output_tokens);
});

test("the AI SDK's default provider (the Responses API): generateText and streamText", async () => {
  const openai = createOpenAI({ baseURL: v1, apiKey, headers });
  const generatedText = await generateText({ model: openai('demo'), prompt: 'Write a haiku', maxRetries: 0 });
  assert.ok(generatedText.text.length > 0, 'generateText returned text');
  count(generatedText.usage, generatedText.usage.inputTokens, generatedText.usage.outputTokens);

  const streamed = streamText({ model: openai('demo'), prompt: 'Stream a haiku', maxRetries: 0 });
  let text = '';
  for await (const delta of streamed.textStream) text += delta;
  assert.ok(text.length > 0, 'streamText streamed text');
  const usage = await streamed.usage;
  count(usage, usage.inputTokens, usage.outputTokens);
});

test('the usage API counts exactly what the replies reported, per endpoint family', async () => {
  const totals = await usageTotals(project.id, { want: generated });
  assert.deepEqual(totals, generated);
  const embeddings = await usageTotals(project.id, { want: embedded, endpoint: 'embeddings' });
  assert.deepEqual({ num_model_requests: embeddings.num_model_requests, input_tokens: embeddings.input_tokens }, embedded);
});
