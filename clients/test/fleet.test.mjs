// The example's demo-fleet, four simulated vLLM servers behind the
// scheduler, through the OpenAI SDK: a conversation's later turns land on
// the server holding its earlier ones (their prompt comes back cached), and
// `priority` is forwarded to a model that schedules by it and refused by
// one that does not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { v1, apiKey, uniqueProject, usageTotals } from '../lib/gateway.mjs';

const project = uniqueProject('fleet');
const client = new OpenAI({ baseURL: v1, apiKey, defaultHeaders: { 'Compat-Project': project.id }, maxRetries: 0 });

// A system prompt of its own per run, long enough to fill many cache blocks.
const instructions = `You answer for run ${project.project}. ` +
  Array.from({ length: 300 }, (_, i) => `rule${i}`).join(' ');

test('demo-fleet: a conversation stays where its prompt is cached, and usage counts the cached tokens', async () => {
  const messages = [{ role: 'system', content: instructions }];
  const totals = { input_tokens: 0, input_cached_tokens: 0, output_tokens: 0 };
  for (let turn = 0; turn < 4; turn++) {
    messages.push({ role: 'user', content: `Question ${turn}: what is rule${turn * 7}?` });
    const stream = await client.chat.completions.create({
      model: 'demo-fleet', stream: true, stream_options: { include_usage: true }, max_tokens: 8, messages,
    });
    let text = '';
    let usage;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    assert.ok(text.length > 0, `turn ${turn} carried text`);
    assert.ok(usage, `turn ${turn} brought its usage chunk`);
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    if (turn === 0) {
      assert.equal(cached, 0, 'the first turn finds nothing cached on a fresh fleet');
    } else {
      // Everything the previous turn sent, but for the block it ended in.
      assert.ok(cached >= 300 && cached < usage.prompt_tokens,
        `turn ${turn}: ${cached} of ${usage.prompt_tokens} prompt tokens cached; the scheduler sent it off the server holding the conversation`);
    }
    totals.input_tokens += usage.prompt_tokens;
    totals.input_cached_tokens += cached;
    totals.output_tokens += usage.completion_tokens;
    messages.push({ role: 'assistant', content: text });
  }
  const got = await usageTotals(project.id, { want: { ...totals, num_model_requests: 4 }, cached: true });
  assert.deepEqual(got, { ...totals, num_model_requests: 4 }, 'the usage API counts what the replies reported, cached tokens included');
});

test('demo-fleet: priority is forwarded where the model schedules by it, refused where not', async () => {
  const res = await client.chat.completions.create({
    model: 'demo-fleet', priority: -1, max_tokens: 4, messages: [{ role: 'user', content: 'Urgent' }],
  });
  assert.equal(res.model, 'demo-fleet');
  assert.ok(res.choices[0].message.content.length > 0, 'the urgent request was answered');

  await assert.rejects(
    client.chat.completions.create({ model: 'demo', priority: -1, messages: [{ role: 'user', content: 'Urgent' }] }),
    (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `got ${err}`);
      assert.equal(err.param, 'priority');
      assert.equal(err.type, 'invalid_request_error');
      assert.match(err.message, /priority scheduling/);
      return true;
    },
  );
});
