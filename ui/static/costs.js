// Costs and projects: pure functions over the costs API's daily buckets
// (GET /v1/organization/costs, group_by=project_id) and the Admin API's
// projects, for the dashboard's projects card.

// costsByProject sums a costs answer's buckets by project: the buckets'
// starts, per project its dollars per bucket (series) and in all (total),
// by total descending then name, and the total of every project.
export function costsByProject(buckets) {
  const starts = buckets.map((b) => b.start_time);
  const groups = new Map();
  let total = 0;
  buckets.forEach((b, i) => {
    for (const r of b.results ?? []) {
      const name = r.project_id ?? '(all)';
      const value = r.amount?.value ?? 0;
      if (!groups.has(name)) groups.set(name, { name, total: 0, series: new Array(buckets.length).fill(0) });
      const g = groups.get(name);
      g.series[i] += value;
      g.total += value;
      total += value;
    }
  });
  const sorted = [...groups.values()].sort((a, b) => b.total - a.total || a.name.localeCompare(b.name));
  return { starts, groups: sorted, total };
}

// monthStart is the start of the UTC month of nowSeconds, in unix seconds:
// spend limits count a month's spend.
export function monthStart(nowSeconds) {
  const d = new Date(nowSeconds * 1000);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000;
}

// spendSince sums each project's dollars in the buckets from since on.
export function spendSince(buckets, since) {
  const out = new Map();
  for (const b of buckets) {
    if (b.start_time < since) continue;
    for (const r of b.results ?? []) {
      const name = r.project_id ?? '(all)';
      out.set(name, (out.get(name) ?? 0) + (r.amount?.value ?? 0));
    }
  }
  return out;
}

// fmtUSD formats dollars: cents in general, more digits for the small
// amounts a few requests cost.
export function fmtUSD(v) {
  const n = Number(v);
  if (!Number.isFinite(n)) return '–';
  const digits = n !== 0 && Math.abs(n) < 1 ? 6 : 2;
  return `$${n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })}`;
}
