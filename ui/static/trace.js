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

// CLIENT_CLOSED_STATUS is the status a request whose client left before
// the answer is recorded with (nginx's 499).
const CLIENT_CLOSED_STATUS = 499;

// callStatus tells what became of a call: { text, cls } for its badge and
// the error it failed with (empty when none). A gateway call whose client
// closed its stream, or left before the answer, is "client closed": the
// client's doing, not a failure; its tokens are what was streamed until
// then. A stream the backend broke off is "broken off", with its error.
export function callStatus(call) {
  const attrs = call.attributes ?? {};
  const exception = typeof call.exception === 'string' ? call.exception : call.exception ? JSON.stringify(call.exception) : '';
  if (attrs.status === CLIENT_CLOSED_STATUS || (attrs.incomplete === true && exception.startsWith('client closed'))) {
    return { text: 'client closed', cls: 'closed', error: '' };
  }
  if (attrs.incomplete === true) return { text: 'broken off', cls: 'error', error: exception || 'the stream ended early' };
  if (exception) return { text: 'error', cls: 'error', error: exception };
  if (!call.ended_at) return { text: 'running', cls: 'running', error: '' };
  return { text: 'ok', cls: 'ok', error: '' };
}

function callRow(node, usage) {
  const c = node.call;
  const u = sumUsage(usage[c.id]);
  const st = callStatus(c);
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
      el('span', { class: `badge ${st.cls}`, 'data-testid': 'trace-call-status', text: st.text }),
      el('span', { class: 'op', text: c.display_name || c.op_name, title: c.op_name }),
      el('span', { class: 'muted id', text: c.id, title: `started ${fmtTime(c.started_at)}` }),
      detail ? el('span', { class: 'muted', text: detail }) : null,
      st.error ? el('span', { class: 'error', 'data-testid': 'trace-call-error', text: st.error }) : null,
      st.text === 'client closed'
        ? el('span', { class: 'muted', 'data-testid': 'trace-call-streamed', text: `streamed ${fmtInt(u.completion)} completion tokens before the client left` })
        : null,
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
