// The dashboard's charts, drawn by the vendored Chart.js (loaded by a
// classic script before the modules run, as window.Chart).

import { fmtSeconds, fmtShort } from './dom.js';

// PALETTE colours the stacked series; the last is for "other".
const PALETTE = ['#2563eb', '#16a34a', '#ea580c', '#9333ea', '#0891b2', '#dc2626', '#ca8a04', '#db2777', '#4b5563'];

// MAX_SERIES is how many groups get a series of their own; the rest are
// stacked together as "other" (the table below the chart lists them all).
const MAX_SERIES = 8;

function chartLib() {
  const Chart = globalThis.Chart;
  if (!Chart) throw new Error('Chart.js did not load');
  return Chart;
}

function baseOptions() {
  return {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    interaction: { mode: 'index', intersect: false },
    plugins: { legend: { position: 'bottom', labels: { boxWidth: 12 } } },
  };
}

// Charts owns the dashboard's Chart.js instances and updates them in place.
export class Charts {
  constructor() {
    this.charts = new Map();
  }

  // draw creates the chart on canvas the first time, and afterwards
  // replaces its data and options.
  draw(canvas, config) {
    const old = this.charts.get(canvas);
    if (old && old.config.type === config.type) {
      old.data = config.data;
      old.options = config.options;
      old.update('none');
      return;
    }
    old?.destroy();
    const Chart = chartLib();
    this.charts.set(canvas, new Chart(canvas, config));
  }

  // destroyAll removes every chart (on sign-out).
  destroyAll() {
    for (const c of this.charts.values()) c.destroy();
    this.charts.clear();
  }

  // tokens draws tokens per bucket stacked by group.
  tokens(canvas, labels, groups) {
    this.stacked(canvas, labels, groups, 'tokens', fmtShort);
  }

  // costs draws dollars per day stacked by project.
  costs(canvas, labels, groups) {
    this.stacked(canvas, labels, groups, 'US dollars', (v) => `$${v}`);
  }

  // stacked draws a value per bucket stacked by group, in unit.
  stacked(canvas, labels, groups, unit, tick) {
    const shown = groups.slice(0, MAX_SERIES);
    const datasets = shown.map((g, i) => ({
      label: g.name,
      data: g.series,
      backgroundColor: PALETTE[i % PALETTE.length],
      stack: unit,
    }));
    if (groups.length > MAX_SERIES) {
      const other = new Array(labels.length).fill(0);
      for (const g of groups.slice(MAX_SERIES)) g.series.forEach((v, i) => (other[i] += v));
      datasets.push({ label: `other (${groups.length - MAX_SERIES})`, data: other, backgroundColor: PALETTE[PALETTE.length - 1], stack: unit });
    }
    const options = baseOptions();
    options.scales = {
      x: { stacked: true, ticks: { maxRotation: 0, autoSkipPadding: 12 } },
      y: { stacked: true, beginAtZero: true, ticks: { callback: tick }, title: { display: true, text: unit } },
    };
    this.draw(canvas, { type: 'bar', data: { labels, datasets }, options });
  }

  // requests draws requests per bucket.
  requests(canvas, labels, counts) {
    const options = baseOptions();
    options.plugins.legend.display = false;
    options.scales = {
      x: { ticks: { maxRotation: 0, autoSkipPadding: 12 } },
      y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: 'requests' } },
    };
    this.draw(canvas, {
      type: 'bar',
      data: { labels, datasets: [{ label: 'requests', data: counts, backgroundColor: PALETTE[0] }] },
      options,
    });
  }

  // latency draws p50/p90/p99 of request duration and time to first token
  // per model, in milliseconds.
  latency(canvas, models) {
    const labels = [];
    const series = { p50: [], p90: [], p99: [] };
    for (const m of models) {
      for (const [what, h] of [['total', m.latency], ['first token', m.ttft]]) {
        if (!(h.count > 0)) continue;
        labels.push(`${m.model} · ${what}`);
        for (const p of Object.keys(series)) series[p].push(Number.isFinite(h[p]) ? h[p] * 1000 : null);
      }
    }
    const options = baseOptions();
    options.scales = {
      x: { ticks: { maxRotation: 0 } },
      y: { beginAtZero: true, title: { display: true, text: 'milliseconds' } },
    };
    options.plugins.tooltip = { callbacks: { label: (ctx) => `${ctx.dataset.label}: ${fmtSeconds(ctx.parsed.y / 1000)}` } };
    this.draw(canvas, {
      type: 'bar',
      data: {
        labels,
        datasets: Object.entries(series).map(([p, data], i) => ({ label: p, data, backgroundColor: PALETTE[i] })),
      },
      options,
    });
  }
}
