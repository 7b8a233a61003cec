// Anthropic's Messages API through the gateway with the clients that speak
// it: the official Anthropic SDK, the Vercel AI SDK's Anthropic provider,
// LangChain's ChatAnthropic and Claude Code's CLI, each changed only in its
// base URL, against the example config's `demo` model (its simulated
// backend serves /v1/messages natively, as vLLM does). The usage API then
// shows exactly the tokens the clients were told.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import Anthropic from '@anthropic-ai/sdk';
import { createAnthropic } from '@ai-sdk/anthropic';
import { generateText, streamText, tool } from 'ai';
import { ChatAnthropic } from '@langchain/anthropic';
import { baseURL, v1, apiKey, uniqueProject, usageTotals } from '../lib/gateway.mjs';

const project = uniqueProject('anthropic');
const headers = { 'Compat-Project': project.id };
const client = new Anthropic({ baseURL, apiKey, defaultHeaders: headers, maxRetries: 0 });

// What the clients were told, summed: the usage API's input_tokens is the
// whole prompt (input, cache reads and cache writes).
const told = { input_tokens: 0, output_tokens: 0, num_model_requests: 0 };
function tell(u) {
  told.input_tokens += u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
  told.output_tokens += u.output_tokens;
  told.num_model_requests += 1;
}

const weather = {
  name: 'get_weather',
  description: 'The weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const clock = {
  name: 'get_time',
  description: 'The time in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

test('Anthropic SDK: messages.create, plain, system as string and blocks, multi-turn', async () => {
  const plain = await client.messages.create({ model: 'demo', max_tokens: 256, messages: [{ role: 'user', content: 'Hello there' }] });
  assert.equal(plain.type, 'message');
  assert.equal(plain.role, 'assistant');
  assert.equal(plain.model, 'demo');
  assert.match(plain.id, /^msg_/);
  assert.equal(plain.content[0].type, 'text');
  assert.ok(plain.content[0].text.length > 0);
  assert.equal(plain.stop_reason, 'end_turn');
  assert.ok(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0);
  tell(plain.usage);

  const sysString = await client.messages.create({
    model: 'demo', max_tokens: 256, system: 'You are terse.', messages: [{ role: 'user', content: 'Hello there' }],
  });
  const sysBlocks = await client.messages.create({
    model: 'demo', max_tokens: 256, system: [{ type: 'text', text: 'You are terse.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello there' }] }],
  });
  assert.ok(sysString.usage.input_tokens > plain.usage.input_tokens, 'the system prompt is counted');
  assert.equal(sysBlocks.usage.input_tokens, sysString.usage.input_tokens, 'a system string and its blocks count alike');
  tell(sysString.usage);
  tell(sysBlocks.usage);

  const multi = await client.messages.create({
    model: 'demo', max_tokens: 256,
    messages: [
      { role: 'user', content: 'Hello there' },
      { role: 'assistant', content: plain.content },
      { role: 'user', content: 'And again' },
    ],
  });
  assert.ok(multi.usage.input_tokens > plain.usage.input_tokens, 'the conversation is counted');
  tell(multi.usage);
});

test('Anthropic SDK: max_tokens and stop_sequences stop reasons', async () => {
  const cut = await client.messages.create({ model: 'demo', max_tokens: 3, messages: [{ role: 'user', content: 'Count' }] });
  assert.equal(cut.stop_reason, 'max_tokens');
  assert.equal(cut.usage.output_tokens, 3);
  tell(cut.usage);

  const stopped = await client.messages.create({
    model: 'demo', max_tokens: 256, stop_sequences: ['tok3'], messages: [{ role: 'user', content: 'Count' }],
  });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, 'tok3');
  assert.ok(!stopped.content[0].text.includes('tok3'), 'the stop sequence is not in the text');
  tell(stopped.usage);
});

test('Anthropic SDK: messages.stream event order and finalMessage()', async () => {
  const stream = client.messages.stream({ model: 'demo', max_tokens: 256, messages: [{ role: 'user', content: 'Stream to me' }] });
  const kinds = [];
  let text = '';
  for await (const ev of stream) {
    if (kinds.at(-1) !== ev.type) kinds.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
  }
  assert.deepEqual(kinds, ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, text);
  assert.equal(final.stop_reason, 'end_turn');
  assert.ok(final.usage.output_tokens > 0 && final.usage.input_tokens > 0);
  tell(final.usage);
});

test('Anthropic SDK: tools forced, any and auto, a tool_result round trip', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const forced = await client.messages.create({
    model: 'demo', max_tokens: 256, tools: [weather, clock], tool_choice: { type: 'tool', name: 'get_time' }, messages,
  });
  const call = forced.content.find((b) => b.type === 'tool_use');
  assert.equal(forced.stop_reason, 'tool_use');
  assert.equal(call.name, 'get_time');
  assert.equal(typeof call.input, 'object');
  tell(forced.usage);

  const any = await client.messages.create({ model: 'demo', max_tokens: 256, tools: [weather, clock], tool_choice: { type: 'any' }, messages });
  assert.equal(any.content.find((b) => b.type === 'tool_use').name, 'get_weather');
  tell(any.usage);

  const auto = await client.messages.create({
    model: 'demo', max_tokens: 256, tools: [weather, clock], tool_choice: { type: 'auto' },
    messages: [{ role: 'user', content: 'Please call get_time for Paris' }],
  });
  assert.equal(auto.content.find((b) => b.type === 'tool_use').name, 'get_time');
  tell(auto.usage);

  const answered = await client.messages.create({
    model: 'demo', max_tokens: 256, tools: [weather, clock],
    messages: [
      ...messages,
      { role: 'assistant', content: forced.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: '12:00' }] },
    ],
  });
  assert.equal(answered.stop_reason, 'end_turn');
  assert.equal(answered.content[0].type, 'text');
  tell(answered.usage);
});

test('Anthropic SDK: a streamed tool call joins into valid JSON', async () => {
  const stream = client.messages.stream({
    model: 'demo', max_tokens: 256, tools: [weather], tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather in Oslo?' }],
  });
  let partial = '';
  for await (const ev of stream) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') partial += ev.delta.partial_json;
  }
  const final = await stream.finalMessage();
  const call = final.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(JSON.parse(partial), call.input);
  assert.equal(typeof call.input.city, 'string');
  tell(final.usage);
});

test('Anthropic SDK: countTokens agrees with the reply', async () => {
  const body = { model: 'demo', system: 'Count me', messages: [{ role: 'user', content: 'How many tokens is this?' }] };
  const counted = await client.messages.countTokens(body);
  const reply = await client.messages.create({ ...body, max_tokens: 16 });
  assert.equal(counted.input_tokens, reply.usage.input_tokens);
  tell(reply.usage);
});

test('Anthropic SDK: 401, 400 and 404 as typed errors', async () => {
  const wrong = new Anthropic({ baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: 'demo', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error?.error?.type === 'authentication_error');
  await assert.rejects(client.messages.create({ model: 'demo', max_tokens: 0, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && /max_tokens/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'nope', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.status === 404 && e.error?.error?.type === 'not_found_error');
});

test('Vercel AI SDK @ai-sdk/anthropic: generateText, streamText, a required tool', async () => {
  const anthropic = createAnthropic({ baseURL: v1, apiKey, headers });
  const gen = await generateText({ model: anthropic('demo'), prompt: 'Hello there', maxOutputTokens: 256, maxRetries: 0 });
  assert.ok(gen.text.length > 0);
  told.input_tokens += gen.usage.inputTokens;
  told.output_tokens += gen.usage.outputTokens;
  told.num_model_requests += 1;

  const streamed = streamText({ model: anthropic('demo'), prompt: 'Stream to me', maxOutputTokens: 256, maxRetries: 0 });
  let text = '';
  for await (const part of streamed.textStream) text += part;
  assert.ok(text.length > 0);
  const usage = await streamed.usage;
  told.input_tokens += usage.inputTokens;
  told.output_tokens += usage.outputTokens;
  told.num_model_requests += 1;

  const withTool = await generateText({
    model: anthropic('demo'), prompt: 'Weather in Rome?', maxOutputTokens: 256, maxRetries: 0, toolChoice: 'required',
    tools: { get_weather: tool({ description: 'The weather for a city', inputSchema: z.object({ city: z.string() }) }) },
  });
  assert.equal(withTool.toolCalls.length, 1);
  assert.equal(withTool.toolCalls[0].toolName, 'get_weather');
  assert.equal(typeof withTool.toolCalls[0].input.city, 'string');
  told.input_tokens += withTool.usage.inputTokens;
  told.output_tokens += withTool.usage.outputTokens;
  told.num_model_requests += 1;
});

test('LangChain ChatAnthropic: invoke and bindTools', async () => {
  const llm = new ChatAnthropic({ model: 'demo', apiKey, anthropicApiUrl: baseURL, maxRetries: 0, clientOptions: { defaultHeaders: headers } });
  const msg = await llm.invoke('Hello there');
  assert.ok(typeof msg.content === 'string' ? msg.content.length > 0 : msg.content.length > 0);
  told.input_tokens += msg.usage_metadata.input_tokens;
  told.output_tokens += msg.usage_metadata.output_tokens;
  told.num_model_requests += 1;

  const withTools = llm.bindTools([{ name: 'get_weather', description: 'The weather for a city', schema: z.object({ city: z.string() }) }],
    { tool_choice: 'get_weather' });
  const called = await withTools.invoke('Weather in Rome?');
  assert.equal(called.tool_calls.length, 1);
  assert.equal(called.tool_calls[0].name, 'get_weather');
  assert.equal(typeof called.tool_calls[0].args.city, 'string');
  told.input_tokens += called.usage_metadata.input_tokens;
  told.output_tokens += called.usage_metadata.output_tokens;
  told.num_model_requests += 1;
});

// claudeBinary is the CLI of @anthropic-ai/claude-code in clients/.
const claudeBinary = join(dirname(fileURLToPath(import.meta.url)), '..', 'node_modules', '.bin', 'claude');

function runClaude(args, env) {
  return new Promise((resolve, reject) => {
    const child = spawn(claudeBinary, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
    child.on('error', (e) => { clearTimeout(timer); reject(e); });
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, out, err }); });
  });
}

// Claude Code files its usage under a project of its own: how many calls
// one prompt makes is the CLI's business, but their tokens must be exact.
const claudeProject = uniqueProject('claude-code');

test('Claude Code: claude -p answers from the gateway, its tokens exact in the usage API', async (t) => {
  const home = await mkdtemp(join(tmpdir(), 'tollgate-claude-'));
  t.after(() => rm(home, { recursive: true, force: true }));
  // Only what a user sets, a scratch HOME, and no proxy: the gateway is
  // the one host the CLI can reach.
  const env = {
    PATH: process.env.PATH, HOME: home, TMPDIR: home,
    ANTHROPIC_BASE_URL: baseURL, ANTHROPIC_API_KEY: apiKey,
    ANTHROPIC_MODEL: 'demo', ANTHROPIC_SMALL_FAST_MODEL: 'demo', ANTHROPIC_DEFAULT_HAIKU_MODEL: 'demo',
    ANTHROPIC_CUSTOM_HEADERS: `Compat-Project: ${claudeProject.id}`,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1', NO_PROXY: '*',
  };
  let run;
  try {
    run = await runClaude(['-p', 'Say hello', '--output-format', 'json'], env);
  } catch (e) {
    t.skip(`SKIPPED: the claude CLI cannot run here: ${e.message}`);
    return;
  }
  assert.equal(run.code, 0, `claude exited ${run.code}: ${run.err}${run.out}`);
  const result = JSON.parse(run.out.trim().split('\n').at(-1));
  assert.equal(result.type, 'result');
  assert.equal(result.is_error, false, run.out);
  assert.match(result.result, /tok0/, 'the answer is the simulated backend\'s');
  // Every call the CLI made is in modelUsage, by model; all went to demo.
  const used = result.modelUsage.demo;
  const want = { input_tokens: used.inputTokens + used.cacheReadInputTokens + used.cacheCreationInputTokens, output_tokens: used.outputTokens };
  const totals = await usageTotals(claudeProject.id, { want });
  assert.deepEqual({ input_tokens: totals.input_tokens, output_tokens: totals.output_tokens }, want);
  assert.ok(totals.num_model_requests >= result.num_turns, 'every call the CLI made is recorded');
});

test('the usage API shows exactly what the Anthropic clients were told', async () => {
  const totals = await usageTotals(project.id, { want: told });
  assert.deepEqual(totals, told);
});
