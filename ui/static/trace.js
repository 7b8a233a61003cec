// One trace's calls as a tree with their rolled-up usage.

import { el, fmtInt, fmtSeconds, fmtTime } from './dom.js';

// buildTree links calls by parent_id. A call whose parent is not among the
// calls is a root. Children keep the calls' order (oldest first).
export function buildTree(calls) {
  const nodes = new Map(calls.map((c) => [c.id, { call: c, children: [] }]));
  const roots = [];
  for (const n of nodes.values()) {
    const parent = n.call.parent_id ? nodes.get(n.call.parent_id) : undefined;
    if (parent && parent !== n) parent.children.push(n);
    else roots.push(n);
  }
  return roots;
}

// sumUsage adds up one call's usage over its models (a /trace/usage
// call_usage entry).
export function sumUsage(byModel = {}) {
  const t = { requests: 0, prompt: 0, completion: 0, total: 0, models: Object.keys(byModel) };
  for (const u of Object.values(byModel)) {
    t.requests += u.requests ?? 0;
    t.prompt += u.prompt_tokens ?? 0;
    t.completion += u.completion_tokens ?? 0;
    t.total += u.total_tokens ?? 0;
  }
  return t;
}

function duration(call) {
  if (!call.ended_at) return null;
  return (new Date(call.ended_at) - new Date(call.started_at)) / 1000;
}

function status(call) {
  if (call.exception) return ['error', 'error'];
  if (!call.ended_at) return ['running', 'running'];
  return ['ok', 'ok'];
}

function callRow(node, usage) {
  const c = node.call;
  const u = sumUsage(usage[c.id]);
  const [statusText, statusClass] = status(c);
  const d = duration(c);
  // A completion an SDK traced through the gateway carries the gateway's
  // attributes under attributes.gateway (README, "Every token is counted once").
  const attrs = c.attributes?.gateway ?? c.attributes ?? {};
  const detail = [attrs.key_name && `key ${attrs.key_name}`, attrs.backend && `backend ${attrs.backend}`, u.models.length && u.models.join(', ')]
    .filter(Boolean)
    .join(' · ');
  return el(
    'div',
    { class: 'call', 'data-testid': 'trace-call', 'data-call-id': c.id },
    el(
      'div',
      { class: 'call-name' },
      el('span', { class: `badge ${statusClass}`, text: statusText }),
      el('span', { class: 'op', text: c.display_name || c.op_name, title: c.op_name }),
      el('span', { class: 'muted id', text: c.id, title: `started ${fmtTime(c.started_at)}` }),
      detail ? el('span', { class: 'muted', text: detail }) : null,
    ),
    el('span', { class: 'num', 'data-testid': 'trace-call-requests', text: fmtInt(u.requests) }),
    el('span', { class: 'num', 'data-testid': 'trace-call-prompt', text: fmtInt(u.prompt) }),
    el('span', { class: 'num', 'data-testid': 'trace-call-completion', text: fmtInt(u.completion) }),
    el('span', { class: 'num strong', 'data-testid': 'trace-call-total', text: fmtInt(u.total) }),
    el('span', { class: 'num muted', text: d === null ? '–' : fmtSeconds(d) }),
  );
}

function renderNodes(nodes, usage) {
  return el(
    'ul',
    { class: 'tree' },
    nodes.map((n) => el('li', {}, callRow(n, usage), n.children.length ? renderNodes(n.children, usage) : null)),
  );
}

// renderTrace fills container with the tree of calls and returns the
// trace's total usage (the sum over its roots, each already rolled up).
export function renderTrace(container, calls, traceUsage) {
  const usage = traceUsage.call_usage ?? {};
  const roots = buildTree(calls);
  const header = el(
    'div',
    { class: 'call head' },
    el('span', { text: 'call' }),
    el('span', { class: 'num', text: 'requests' }),
    el('span', { class: 'num', text: 'prompt' }),
    el('span', { class: 'num', text: 'completion' }),
    el('span', { class: 'num', text: 'total tokens' }),
    el('span', { class: 'num', text: 'duration' }),
  );
  container.replaceChildren(header, renderNodes(roots, usage));
  const total = { requests: 0, prompt: 0, completion: 0, total: 0 };
  for (const r of roots) {
    const u = sumUsage(usage[r.call.id]);
    for (const k of Object.keys(total)) total[k] += u[k];
  }
  return total;
}
