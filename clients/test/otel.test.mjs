// The OpenTelemetry JS SDK exporting to the gateway's trace service, as an
// application instrumented with OpenTelemetry (not Weave's SDK) logs to
// Weave: a root span over a GenAI chat span, the root repeating its
// child's usage as agent instrumentations do, sent to /otel/v1/traces in
// protobuf and in OTLP/JSON. Then /calls/stream_query shows the spans as
// calls under their parents, and /calls/usage gives the root exactly the
// chat's tokens, once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { trace, ROOT_CONTEXT } from '@opentelemetry/api';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { OTLPTraceExporter as JSONExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { baseURL, apiKey, uniqueProject } from '../lib/gateway.mjs';

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
