// Tool calling and structured outputs through the gateway with the clients
// agents are written in: the Vercel AI SDK, the official OpenAI SDK and
// LangChain, against the example config's `demo` model (tool_calling: true,
// served by the simulated backend, which honours tools, response formats,
// logprobs, stop, n and seed as vLLM does).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { generateText, streamText, generateObject, tool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { v1, apiKey, uniqueProject } from '../lib/gateway.mjs';

const project = uniqueProject('tools');
const headers = { 'Compat-Project': project.id };
const openai = new OpenAI({ baseURL: v1, apiKey, defaultHeaders: headers, maxRetries: 0 });
const provider = createOpenAICompatible({
  name: 'tollgate', baseURL: v1, apiKey, headers, includeUsage: true, supportsStructuredOutputs: true,
});
const model = provider.chatModel('demo');

const weatherInput = z.object({
  city: z.string(),
  unit: z.enum(['celsius', 'fahrenheit']),
  days: z.number().int().min(1).max(7).optional(),
});
const aiTools = {
  get_weather: tool({ description: 'The weather forecast for a city', inputSchema: weatherInput }),
  lookup_order: tool({
    description: 'Look up an order by id',
    inputSchema: z.object({ order_id: z.string(), include_items: z.boolean() }),
  }),
};
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather forecast for a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};

test('AI SDK generateText calls a tool on "auto" when the user names it', async () => {
  const res = await generateText({ model, tools: aiTools, prompt: 'Please call get_weather for Paris.' });
  assert.equal(res.toolCalls.length, 1, `tool calls: ${JSON.stringify(res.toolCalls)}`);
  assert.equal(res.toolCalls[0].toolName, 'get_weather');
  weatherInput.parse(res.toolCalls[0].input);
  assert.equal(res.finishReason, 'tool-calls');
});

test('AI SDK generateText answers in text on "auto" when no tool is named', async () => {
  const res = await generateText({ model, tools: aiTools, prompt: 'Tell me a short story.' });
  assert.equal(res.toolCalls.length, 0);
  assert.ok(res.text.length > 0);
  assert.equal(res.finishReason, 'stop');
});

test('AI SDK generateText with toolChoice "required" calls a tool with valid input', async () => {
  const res = await generateText({ model, tools: aiTools, toolChoice: 'required', prompt: 'Anything.' });
  assert.equal(res.toolCalls.length, 1);
  const call = res.toolCalls[0];
  assert.ok(call.toolName in aiTools, call.toolName);
  aiTools[call.toolName].inputSchema.parse(call.input);
});

test('AI SDK streamText with a named tool streams a valid call', async () => {
  const result = streamText({
    model, tools: aiTools, toolChoice: { type: 'tool', toolName: 'lookup_order' }, prompt: 'Where is my order?',
  });
  const calls = [];
  let deltas = 0;
  for await (const part of result.fullStream) {
    if (part.type === 'tool-call') calls.push(part);
    if (part.type === 'tool-input-delta') deltas++;
    if (part.type === 'error') throw part.error;
  }
  assert.equal(calls.length, 1);
  assert.equal(calls[0].toolName, 'lookup_order');
  aiTools.lookup_order.inputSchema.parse(calls[0].input);
  assert.ok(deltas >= 2, `the arguments arrived in ${deltas} fragments`);
  const usage = await result.usage;
  assert.ok(usage.outputTokens > 0, 'streamed tool calls are metered');
});

test('AI SDK generateObject returns an object valid against a zod schema', async () => {
  const schema = z.object({
    name: z.string(),
    age: z.number().int(),
    tags: z.array(z.string()),
    address: z.object({ city: z.string(), zip: z.string().optional() }),
    role: z.enum(['admin', 'user']),
    active: z.boolean(),
  });
  const res = await generateObject({ model, schema, prompt: 'Make up a user.' });
  schema.parse(res.object);
  assert.ok(res.usage.outputTokens > 0);
});

test('OpenAI SDK chat.completions.parse with zodResponseFormat', async () => {
  const Event = z.object({ title: z.string(), attendees: z.array(z.string()), priority: z.number().int(), confirmed: z.boolean() });
  const res = await openai.chat.completions.parse({
    model: 'demo',
    messages: [{ role: 'user', content: 'Extract the event.' }],
    response_format: zodResponseFormat(Event, 'event'),
  });
  const parsed = res.choices[0].message.parsed;
  assert.ok(parsed, `no parsed output: ${JSON.stringify(res.choices[0].message)}`);
  Event.parse(parsed);
});

test('OpenAI SDK streamed required tool call: fragments join into valid JSON', async () => {
  const stream = await openai.chat.completions.create({
    model: 'demo', stream: true, stream_options: { include_usage: true }, tools: [weatherTool], tool_choice: 'required',
    messages: [{ role: 'user', content: 'What is the weather?' }],
  });
  let args = '';
  let name = '';
  let id = '';
  let finish = null;
  let fragments = 0;
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    for (const tc of choice.delta?.tool_calls ?? []) {
      assert.equal(tc.index, 0);
      if (tc.id) id = tc.id;
      if (tc.function?.name) name += tc.function.name;
      if (tc.function?.arguments) { args += tc.function.arguments; fragments++; }
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.equal(name, 'get_weather');
  assert.ok(id.length > 0, 'the call has an id');
  assert.ok(fragments >= 2, `arguments came in ${fragments} fragments`);
  const parsed = JSON.parse(args);
  assert.equal(typeof parsed.city, 'string');
  assert.ok(['celsius', 'fahrenheit'].includes(parsed.unit), parsed.unit);
  assert.equal(finish, 'tool_calls');
  assert.ok(usage.completion_tokens > 0);
});

test('OpenAI SDK tool-result round trip ends in a text answer', async () => {
  const first = await openai.chat.completions.create({
    model: 'demo', tools: [weatherTool], tool_choice: 'required',
    messages: [{ role: 'user', content: 'Weather in Oslo?' }],
  });
  const msg = first.choices[0].message;
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.tool_calls.length, 1);
  const second = await openai.chat.completions.create({
    model: 'demo', tools: [weatherTool],
    messages: [
      { role: 'user', content: 'Weather in Oslo?' },
      msg,
      { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"temperature": 3, "unit": "celsius"}' },
    ],
  });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.ok(second.choices[0].message.content.length > 0);
  assert.ok(!second.choices[0].message.tool_calls?.length, 'no further call after the tool result');
});

test('OpenAI SDK logprobs and top_logprobs are well formed', async () => {
  const res = await openai.chat.completions.create({
    model: 'demo', logprobs: true, top_logprobs: 3, messages: [{ role: 'user', content: 'Hi' }],
  });
  const content = res.choices[0].logprobs.content;
  assert.equal(content.length, res.usage.completion_tokens);
  assert.equal(content.map((t) => t.token).join(''), res.choices[0].message.content);
  for (const t of content) {
    assert.ok(t.logprob <= 0, `logprob ${t.logprob}`);
    assert.equal(t.top_logprobs.length, 3);
    for (let i = 1; i < t.top_logprobs.length; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
  }
  const stream = await openai.chat.completions.create({
    model: 'demo', stream: true, logprobs: true, top_logprobs: 2, messages: [{ role: 'user', content: 'Hi' }],
  });
  let streamed = 0;
  for await (const chunk of stream) {
    for (const t of chunk.choices[0]?.logprobs?.content ?? []) {
      assert.equal(t.top_logprobs.length, 2);
      streamed++;
    }
  }
  assert.ok(streamed > 0, 'streamed chunks carry logprobs');
});

test('OpenAI SDK seed determinism, n choices and stop strings', async () => {
  const body = { model: 'demo', seed: 42, messages: [{ role: 'user', content: 'Say something long' }] };
  const a = await openai.chat.completions.create(body);
  const b = await openai.chat.completions.create(body);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content, 'same seed and body, same text');
  const c = await openai.chat.completions.create({ ...body, seed: 43 });
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content, 'another seed, other text');

  const many = await openai.chat.completions.create({ ...body, n: 3 });
  assert.deepEqual(many.choices.map((ch) => ch.index), [0, 1, 2]);
  for (const ch of many.choices) assert.ok(ch.message.content.length > 0);

  // Stop at a word from the middle of the seeded text: the reply is cut
  // right before it, with finish_reason "stop".
  const text = a.choices[0].message.content;
  const words = text.split(' ').filter(Boolean);
  assert.ok(words.length >= 4, `need a few words to stop in: ${text}`);
  const stopWord = ' ' + words[Math.floor(words.length / 2)];
  const cut = await openai.chat.completions.create({ ...body, stop: [stopWord] });
  assert.equal(cut.choices[0].finish_reason, 'stop');
  assert.equal(cut.choices[0].message.content, text.slice(0, text.indexOf(stopWord)));

  const short = await openai.chat.completions.create({ ...body, max_completion_tokens: 2 });
  assert.equal(short.choices[0].finish_reason, 'length');
  assert.equal(short.usage.completion_tokens, 2);
});

test('LangChain bindTools and withStructuredOutput', async () => {
  const llm = new ChatOpenAI({ model: 'demo', apiKey, maxRetries: 0, configuration: { baseURL: v1, defaultHeaders: headers } });
  const withTools = llm.bindTools([weatherTool], { tool_choice: 'required' });
  const msg = await withTools.invoke('What is the weather in Rome?');
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].name, 'get_weather');
  assert.equal(typeof msg.tool_calls[0].args.city, 'string');

  const Person = z.object({ name: z.string(), age: z.number().int(), email: z.string() });
  const structured = llm.withStructuredOutput(Person, { name: 'person' });
  const person = await structured.invoke('Invent a person.');
  Person.parse(person);
});
