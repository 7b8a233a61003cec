// The OpenTelemetry JS SDK exporting to the gateway's trace service, as an
// application instrumented with OpenTelemetry (not Weave's SDK) logs to
// Weave: a root span over a GenAI chat span, the root repeating its
// child's usage as agent instrumentations do, sent to /otel/v1/traces in
// protobuf and in OTLP/JSON. Then /calls/stream_query shows the spans as
// calls under their parents, and /calls/usage gives the root exactly the
// chat's tokens, once. Last, the Vercel AI SDK with its OpenTelemetry
// integration calls the example model through the gateway: its spans and
// the gateway's own calls of the same completions count each token once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { context, trace, ROOT_CONTEXT } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { OTLPTraceExporter as JSONExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';
import { baseURL, v1, apiKey, uniqueProject, usageTotals } from '../lib/gateway.mjs';

const auth = { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' };

async function post(route, body) {
  const res = await fetch(`${baseURL}${route}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
  const text = await res.text();
  assert.equal(res.status, 200, `${route} answered ${res.status}: ${text}`);
  return text;
}

// exportAgentTrace exports, with exporter, an agent span over a chat span
// and returns their ids. The chat's usage is 13 in and 8 out.
async function exportAgentTrace(exporter, resourceAttributes) {
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'otel-client-test', ...resourceAttributes }),
    spanProcessors: [new SimpleSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer('tollgate-client-suite', '1.0.0');
  const usage = { 'gen_ai.usage.input_tokens': 13, 'gen_ai.usage.output_tokens': 8 };
  const root = tracer.startSpan('invoke_agent helper', {
    attributes: { 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.request.model': 'demo', ...usage },
  });
  const chat = tracer.startSpan('chat demo', {
    kind: 2, // CLIENT
    attributes: {
      'gen_ai.operation.name': 'chat', 'gen_ai.request.model': 'demo', 'gen_ai.response.model': 'demo',
      'gen_ai.response.finish_reasons': ['stop'], ...usage,
    },
  }, trace.setSpan(ROOT_CONTEXT, root));
  chat.end();
  root.end();
  await provider.forceFlush();
  await provider.shutdown();
  return { root: root.spanContext(), chat: chat.spanContext() };
}

async function checkCalls(project, ids) {
  const text = await post('/calls/stream_query', { project_id: project.id });
  const calls = new Map(text.split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l)).map((c) => [c.id, c]));
  const root = calls.get(ids.root.spanId);
  const chat = calls.get(ids.chat.spanId);
  assert.ok(root && chat, `calls ${[...calls.keys()]} lack ${ids.root.spanId} and ${ids.chat.spanId}`);
  assert.equal(calls.size, 2);
  const t = ids.root.traceId;
  const traceID = `${t.slice(0, 8)}-${t.slice(8, 12)}-${t.slice(12, 16)}-${t.slice(16, 20)}-${t.slice(20)}`;
  assert.equal(root.trace_id, traceID);
  assert.equal(chat.trace_id, traceID);
  assert.equal(root.parent_id, null);
  assert.equal(chat.parent_id, ids.root.spanId);
  assert.equal(root.op_name, 'invoke_agent helper');
  assert.equal(chat.op_name, 'chat demo');
  assert.equal(chat.attributes.gen_ai.operation.name, 'chat');
  assert.deepEqual(chat.attributes.gen_ai.response.finish_reasons, ['stop']);
  assert.ok(chat.ended_at >= chat.started_at, `${chat.started_at} .. ${chat.ended_at}`);

  const usage = JSON.parse(await post('/calls/usage', { project_id: project.id, call_ids: [ids.root.spanId] }));
  const got = usage.call_usage[ids.root.spanId]?.demo;
  assert.ok(got, JSON.stringify(usage));
  assert.deepEqual(
    { requests: got.requests, prompt_tokens: got.prompt_tokens, completion_tokens: got.completion_tokens, total_tokens: got.total_tokens },
    { requests: 1, prompt_tokens: 13, completion_tokens: 8, total_tokens: 21 });
}

test('the OpenTelemetry SDK exports protobuf to /otel/v1/traces, the project in the resource', async () => {
  const project = uniqueProject('otel-proto');
  const exporter = new ProtoExporter({ url: `${baseURL}/otel/v1/traces`, headers: { Authorization: `Bearer ${apiKey}` } });
  const ids = await exportAgentTrace(exporter, { 'wandb.entity': project.team, 'wandb.project': project.project });
  await checkCalls(project, ids);
});

test('the OpenTelemetry SDK exports OTLP/JSON to /otel/v1/traces, the project in the project_id header', async () => {
  const project = uniqueProject('otel-json');
  const exporter = new JSONExporter({
    url: `${baseURL}/otel/v1/traces`,
    headers: { Authorization: `Bearer ${apiKey}`, project_id: project.id },
  });
  const ids = await exportAgentTrace(exporter, {});
  await checkCalls(project, ids);
});

// streamCalls is the project's calls by id, as /calls/stream_query gives
// them.
async function streamCalls(project) {
  const text = await post('/calls/stream_query', { project_id: project.id });
  return new Map(text.split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l)).map((c) => [c.id, c]));
}

test("the Vercel AI SDK's OpenTelemetry integration, calling the example model through the gateway", async (t) => {
  const project = uniqueProject('otel-aisdk');
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({
      'service.name': 'otel-client-test', 'wandb.entity': project.team, 'wandb.project': project.project,
    }),
    spanProcessors: [new SimpleSpanProcessor(new ProtoExporter({
      url: `${baseURL}/otel/v1/traces`, headers: { Authorization: `Bearer ${apiKey}` },
    }))],
  });
  const tracer = provider.getTracer('ai');
  // The AI SDK makes its steps children of the active span, which an
  // application's OpenTelemetry set-up (NodeSDK, say) keeps in a context
  // manager.
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  t.after(() => {
    context.disable();
    contextManager.disable();
  });
  const openai = createOpenAI({ baseURL: v1, apiKey, headers: { 'Compat-Project': project.id } });
  const telemetry = { isEnabled: true, tracer };

  const gen = await generateText({
    model: openai.chat('demo'), prompt: 'Write a haiku', maxRetries: 0, experimental_telemetry: telemetry,
  });
  // The AI SDK's default provider, the Responses API.
  const streamed = streamText({
    model: openai('demo'), prompt: 'Stream a haiku', maxRetries: 0, experimental_telemetry: telemetry,
  });
  let streamedText = '';
  for await (const delta of streamed.textStream) streamedText += delta;
  const streamedUsage = await streamed.usage;
  assert.ok(gen.text.length > 0 && streamedText.length > 0);
  await provider.forceFlush();
  await provider.shutdown();

  const runs = [
    { root: 'ai.generateText', step: 'ai.generateText.doGenerate', usage: gen.usage, id: gen.response.id, idForm: /^chatcmpl-/ },
    {
      root: 'ai.streamText', step: 'ai.streamText.doStream', usage: streamedUsage,
      id: (await streamed.response).id, idForm: /^resp_/,
    },
  ];
  for (const run of runs) {
    assert.ok(run.usage.inputTokens > 0 && run.usage.outputTokens > 0, JSON.stringify(run.usage));
    assert.match(run.id, run.idForm);
  }

  // The gateway's call of each completion folds into the step that
  // carries its gen_ai.response.id, once the gateway has written it.
  let calls;
  const deadline = Date.now() + 15000;
  for (;;) {
    calls = await streamCalls(project);
    const folded = [...calls.values()].filter((c) => c.attributes?.gateway !== undefined).length;
    if (folded === runs.length || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(calls.size, 2 * runs.length, `calls: ${[...calls.values()].map((c) => c.op_name)}`);
  for (const run of runs) {
    const roots = [...calls.values()].filter((c) => c.op_name === run.root);
    const steps = [...calls.values()].filter((c) => c.op_name === run.step);
    assert.equal(roots.length, 1, run.root);
    assert.equal(steps.length, 1, run.step);
    const [root, step] = [roots[0], steps[0]];
    assert.equal(root.parent_id, null);
    assert.equal(step.parent_id, root.id);
    assert.equal(step.trace_id, root.trace_id);
    assert.equal(step.attributes.gen_ai.response.id, run.id);
    assert.ok(step.attributes.gateway, `the gateway's call of ${run.id} did not fold into ${run.step}`);

    const usage = JSON.parse(await post('/calls/usage', { project_id: project.id, call_ids: [root.id] }));
    const got = usage.call_usage[root.id]?.demo;
    assert.ok(got, JSON.stringify(usage));
    assert.deepEqual(
      { prompt_tokens: got.prompt_tokens, completion_tokens: got.completion_tokens, total_tokens: got.total_tokens },
      {
        prompt_tokens: run.usage.inputTokens, completion_tokens: run.usage.outputTokens,
        total_tokens: run.usage.inputTokens + run.usage.outputTokens,
      });
  }

  // The usage API counts the gateway's own records: the same tokens.
  const want = {
    input_tokens: runs.reduce((n, r) => n + r.usage.inputTokens, 0),
    output_tokens: runs.reduce((n, r) => n + r.usage.outputTokens, 0),
    num_model_requests: runs.length,
  };
  assert.deepEqual(await usageTotals(project.id, { want }), want);
});
