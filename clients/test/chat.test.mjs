// The OpenAI SDK's plain chat: create, stream with and without usage, and
// the usage API counting exactly what the replies reported.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { v1, apiKey, uniqueProject, usageTotals } from '../lib/gateway.mjs';

const project = uniqueProject('chat');
const client = new OpenAI({ baseURL: v1, apiKey, defaultHeaders: { 'Compat-Project': project.id }, maxRetries: 0 });

test('chat completions: plain and streamed, usage exact in the usage API', async () => {
  let prompt = 0;
  let completion = 0;

  const res = await client.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'Hello there' }] });
  assert.equal(res.object, 'chat.completion');
  assert.equal(res.model, 'demo');
  assert.ok(res.choices[0].message.content.length > 0, 'the reply has text');
  assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);
  prompt += res.usage.prompt_tokens;
  completion += res.usage.completion_tokens;

  const stream = await client.chat.completions.create({
    model: 'demo', stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'Stream to me' }],
  });
  let text = '';
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.ok(text.length > 0, 'the stream carried text');
  assert.ok(usage && usage.completion_tokens > 0, 'include_usage brought the usage chunk');
  prompt += usage.prompt_tokens;
  completion += usage.completion_tokens;

  // A stream without include_usage is metered all the same, and its usage
  // chunk is not shown to the client. The same body unstreamed says what
  // the stream must have been counted at.
  const quietBody = { model: 'demo', messages: [{ role: 'user', content: 'No usage please' }] };
  const twin = await client.chat.completions.create(quietBody);
  prompt += 2 * twin.usage.prompt_tokens;
  completion += 2 * twin.usage.completion_tokens;
  const quiet = await client.chat.completions.create({ ...quietBody, stream: true });
  let sawUsage = false;
  for await (const chunk of quiet) if (chunk.usage) sawUsage = true;
  assert.equal(sawUsage, false, 'no usage chunk when the client did not ask');

  const want = { num_model_requests: 4, input_tokens: prompt, output_tokens: completion };
  const totals = await usageTotals(project.id, { want });
  assert.deepEqual(totals, want);
});
