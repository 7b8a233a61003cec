// Small DOM helpers. Server-provided text only ever reaches the page as
// text nodes or attribute values, never as HTML.

// el creates an element. attrs: "class", "text" (textContent), "on<event>"
// (a listener), anything else an attribute (null, undefined and false
// skip it, true sets it empty). Children are nodes or strings (as text).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = String(v);
    else if (k.startsWith('on') && typeof v === 'function') node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

// $ finds the element with a data-testid.
export function $(testid, root = document) {
  return root.querySelector(`[data-testid="${testid}"]`);
}

// setText sets the text of the element with a data-testid, and its
// data-value to the raw value when one is given.
export function setText(testid, text, value) {
  const node = $(testid);
  if (!node) return;
  node.textContent = text;
  if (value === undefined) node.removeAttribute('data-value');
  else node.dataset.value = String(value);
}

// fmtInt formats an integer in full, with thousands separators.
export function fmtInt(n) {
  return Number(n).toLocaleString('en-US', { maximumFractionDigits: 0 });
}

// fmtShort formats a count compactly for chart axes (1.2k, 3.4M).
export function fmtShort(n) {
  return Number(n).toLocaleString('en-US', { notation: 'compact', maximumFractionDigits: 1 });
}

// fmtSeconds formats a duration given in seconds, or "–" for NaN. Under
// 10 ms it keeps two decimals, so that a fast backend's time to first
// token does not read as 0.0 ms.
export function fmtSeconds(s) {
  if (!Number.isFinite(s)) return '–';
  if (s < 0.01) return `${(s * 1000).toFixed(2)} ms`;
  if (s < 1) return `${(s * 1000).toFixed(1)} ms`;
  return `${s.toFixed(2)} s`;
}

// fmtPercent formats a fraction as a percentage, or "–" for NaN.
export function fmtPercent(f) {
  if (!Number.isFinite(f)) return '–';
  return `${(f * 100).toFixed(2)} %`;
}

// fmtTime formats an RFC 3339 time or unix seconds in local time.
export function fmtTime(t) {
  const d = typeof t === 'number' ? new Date(t * 1000) : new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return d.toLocaleString('en-US', { dateStyle: 'medium', timeStyle: 'medium' });
}
