// The official SDK's admin client (client.admin.organization.*) against
// the gateway, with the example configuration's admin key: a project, its
// service account and key, model permissions, a rate limit, a spend limit,
// spend alerts, costs and usage exact to the requests that succeeded, the
// key refused once its account is deleted, and the project archived.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { PermissionDeniedError, RateLimitError } from 'openai';
import { v1, apiKey } from '../lib/gateway.mjs';

// The SDK sends the admin key (adminAPIKey, or OPENAI_ADMIN_KEY) on the
// Admin API's routes; the example configuration's key is an admin key.
const admin = new OpenAI({ baseURL: v1, adminAPIKey: apiKey, maxRetries: 0 }).admin.organization;

// The example configuration's prices, per million tokens.
const PRICES = {
  demo: { prompt: 0.2, completion: 0.6, cached: 0.05 },
  'demo-2': { prompt: 1, completion: 3, cached: 1 },
};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// until retries fn until it returns without throwing, for at most ms.
async function until(ms, fn) {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (Date.now() > deadline) throw e;
      await sleep(50);
    }
  }
}

// Changes reach every replica's enforcer within its poll (250 ms).
const settle = () => sleep(700);

test('Admin API: a project administered with the SDK, enforced, costed and archived', async () => {
  // The example's SQLite file persists between runs: a name of this run's.
  const name = `clients-admin-${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;
  const project = await admin.projects.create({ name });
  assert.equal(project.object, 'organization.project');
  assert.equal(project.name, name);
  assert.equal(project.status, 'active');
  assert.match(project.id, /^proj_/);
  assert.equal((await admin.projects.retrieve(project.id)).name, name);

  const account = await admin.projects.serviceAccounts.create(project.id, { name: 'bot' });
  assert.equal(account.object, 'organization.project.service_account');
  const secret = account.api_key.value;
  assert.match(secret, /^sk-svcacct-/);
  const bot = new OpenAI({ baseURL: v1, apiKey: secret, maxRetries: 0 });

  // Every request that succeeds, to compare with usage and costs.
  const ok = [];
  const complete = async (model) => {
    const res = await bot.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello from a service account' }] });
    ok.push({ model, usage: res.usage });
    return res;
  };
  // A new key works on every replica within a poll of its enforcer.
  const first = await until(2000, () => complete('demo'));
  assert.ok(first.choices[0].message.content.length > 0);
  await complete('demo-2');

  // The key, listed and retrieved, redacted.
  const keys = [];
  for await (const k of admin.projects.apiKeys.list(project.id)) keys.push(k);
  assert.equal(keys.length, 1);
  assert.equal(keys[0].id, account.api_key.id);
  assert.equal(keys[0].redacted_value, `sk-…${secret.slice(-4)}`);
  assert.equal(keys[0].owner.service_account.id, account.id);
  const key = await admin.projects.apiKeys.retrieve(account.api_key.id, { project_id: project.id });
  assert.equal(key.object, 'organization.project.api_key');
  assert.equal(key.redacted_value, keys[0].redacted_value);
  assert.ok(!JSON.stringify(key).includes(secret), 'the secret is never shown again');

  // Model permissions: only demo; demo-2 is refused.
  const perms = await admin.projects.modelPermissions.update(project.id, { mode: 'allow_list', model_ids: ['demo'] });
  assert.deepEqual([perms.mode, perms.model_ids], ['allow_list', ['demo']]);
  await until(2000, async () => {
    // complete counts a request that passes before the change applies.
    await assert.rejects(complete('demo-2'), (e) => {
      assert.ok(e instanceof PermissionDeniedError, `${e}`);
      assert.equal(e.code, 'model_not_found');
      return true;
    });
  });
  await complete('demo');

  // 3 requests a minute on demo: the 4th is a RateLimitError. The four
  // fall in one UTC minute (the limit's window).
  const rl = await admin.projects.rateLimits.updateRateLimit('rl-demo', { project_id: project.id, max_requests_per_1_minute: 3 });
  assert.equal(rl.max_requests_per_1_minute, 3);
  await settle();
  if (new Date().getUTCSeconds() > 50) await sleep((61 - new Date().getUTCSeconds()) * 1000);
  for (let i = 0; i < 3; i++) await complete('demo');
  await assert.rejects(complete('demo'), (e) => {
    assert.ok(e instanceof RateLimitError, `${e}`);
    assert.equal(e.code, 'rate_limit_exceeded');
    return true;
  });
  await admin.projects.rateLimits.updateRateLimit('rl-demo', { project_id: project.id, max_requests_per_1_minute: 0 });

  // A spend limit the project has already run past: at the example's
  // prices a request costs about a thousandth of a cent, so a limit of 0
  // cents is the one a test can exceed. insufficient_quota, not retried;
  // deleted, requests pass again.
  const limit = await admin.projects.spendLimit.update(project.id, { threshold_amount: 0, currency: 'USD', interval: 'month' });
  assert.deepEqual([limit.object, limit.threshold_amount, limit.currency], ['project.spend_limit', 0, 'USD']);
  await until(2000, async () => {
    await assert.rejects(complete('demo'), (e) => {
      assert.ok(e instanceof RateLimitError, `${e}`);
      assert.equal(e.code, 'insufficient_quota');
      assert.equal(e.type, 'insufficient_quota');
      assert.equal(e.headers.get('x-should-retry'), 'false');
      return true;
    });
  });
  await admin.projects.spendLimit.delete(project.id);
  await until(2000, () => complete('demo'));

  // Spend alerts: created, listed, retrieved, updated, deleted.
  const alert = await admin.projects.spendAlerts.create(project.id, {
    threshold_amount: 500, currency: 'USD', interval: 'month', notification_channel: { type: 'email', recipients: ['finance@example.com'] },
  });
  assert.equal(alert.object, 'project.spend_alert');
  assert.equal(alert.threshold_amount, 500);
  const alerts = [];
  for await (const a of admin.projects.spendAlerts.list(project.id)) alerts.push(a.id);
  assert.deepEqual(alerts, [alert.id]);
  const raised = await admin.projects.spendAlerts.update(alert.id, {
    project_id: project.id, threshold_amount: 900, currency: 'USD', interval: 'month',
    notification_channel: { type: 'email', recipients: ['finance@example.com'] },
  });
  assert.equal(raised.threshold_amount, 900);
  assert.equal((await admin.projects.spendAlerts.retrieve(alert.id, { project_id: project.id })).threshold_amount, 900);
  assert.equal((await admin.projects.spendAlerts.delete(alert.id, { project_id: project.id })).deleted, true);

  // Usage counts exactly the requests that succeeded; costs are their
  // tokens at the configuration's prices.
  let wantCost = 0;
  const want = { num_model_requests: ok.length, input_tokens: 0, output_tokens: 0 };
  for (const { model, usage } of ok) {
    const p = PRICES[model];
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    wantCost += ((usage.prompt_tokens - cached) * p.prompt + cached * p.cached + usage.completion_tokens * p.completion) / 1e6;
    want.input_tokens += usage.prompt_tokens;
    want.output_tokens += usage.completion_tokens;
  }
  const start = Math.floor(Date.now() / 1000) - 3600;
  const deadline = Date.now() + 15000;
  let got;
  let cost;
  for (;;) {
    const usage = await admin.usage.completions({ start_time: start, group_by: ['project_id'], limit: 2 });
    got = { num_model_requests: 0, input_tokens: 0, output_tokens: 0 };
    for (const b of usage.data) {
      for (const r of b.results) {
        if (!r.project_id?.startsWith(`${project.id}/`)) continue;
        for (const k of Object.keys(got)) got[k] += r[k];
      }
    }
    const costs = await admin.usage.costs({ start_time: start, project_ids: [project.id], group_by: ['project_id'], limit: 2 });
    cost = 0;
    for (const b of costs.data) {
      for (const r of b.results) {
        assert.equal(r.object, 'organization.costs.result');
        assert.equal(r.project_id, project.id);
        assert.equal(r.amount.currency, 'usd');
        cost += r.amount.value;
      }
    }
    if ((JSON.stringify(got) === JSON.stringify(want) && Math.abs(cost - wantCost) < 1e-6) || Date.now() > deadline) break;
    await sleep(200);
  }
  assert.deepEqual(got, want);
  assert.ok(Math.abs(cost - wantCost) < 1e-6, `costs ${cost}, tokens × prices ${wantCost}`);
  assert.ok(wantCost > 0);

  // The service account deleted, its key is refused within 2 s.
  const gone = await admin.projects.serviceAccounts.delete(account.id, { project_id: project.id });
  assert.equal(gone.deleted, true);
  const deleted = Date.now();
  await until(2000, async () => {
    await assert.rejects(bot.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'hi' }] }), (e) => e.status === 401);
  });
  assert.ok(Date.now() - deleted <= 2100, `refused after ${Date.now() - deleted} ms`);

  const archived = await admin.projects.archive(project.id);
  assert.equal(archived.status, 'archived');
  assert.equal(typeof archived.archived_at, 'number');
  const active = [];
  for await (const p of admin.projects.list()) active.push(p.id);
  assert.ok(!active.includes(project.id), 'an archived project is not listed by default');
});
