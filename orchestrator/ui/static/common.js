// Shared by every page: the page's data attributes, DOM and Plotly text helpers, JSON fetch,
// and the merge of incremental trace rows.
//
// Stored strings (names, values, errors) are text: DOM is built with textContent and never
// parsed as HTML, and what goes to Plotly is escaped by plotText.
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
// The server puts the page's sweep, trial key and poll interval on <body> (no inline script:
// the Content-Security-Policy allows none).
const PAGE = document.body.dataset;
const POLL_MS = Number(PAGE.pollMs) || 2000;

// An element with the given class and text (the text is never parsed as HTML).
function el(tag, text, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

// Plotly draws legend names, titles and hover text as its own small HTML and decodes
// entities: escaping turns a stored "<b>" into the text "<b>". "%" is escaped too, so a
// stored "%{x}" in a hovertemplate is shown, not filled in.
function plotText(v) {
  return String(v).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&#34;").replace(/%/g, "&#37;");
}

// Resolved once the document is parsed, i.e. every script (plotly.min.js, last) has run.
const DOM_READY = new Promise(resolve => {
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", resolve); else resolve();
});

async function getJSON(url) {
  const r = await fetch(url);
  const body = await r.json();
  await DOM_READY;
  if (!r.ok) throw new Error(body.error || (r.status + " " + r.statusText));
  return body;
}

function apiBase() { return "/api/sweeps/" + encodeURIComponent(PAGE.sweep); }

// Append the rows of a traces answer to store[trial_id][column]; a step the store already
// has (a resumed trial rewriting its rows) is skipped.
function mergeTraces(store, answer) {
  const c = answer.columns, ids = c.trial_id, n = ids.length;
  const cols = Object.keys(c).filter(k => k !== "trial_id");
  for (let i = 0; i < n; i++) {
    let t = store[ids[i]];
    if (!t) { t = {}; cols.forEach(k => t[k] = []); store[ids[i]] = t; }
    const steps = t.step;
    if (steps.length && c.step[i] <= steps[steps.length - 1]) continue;
    cols.forEach(k => t[k].push(c[k][i]));
  }
  return n;
}

function fmt(v, digits) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits || 3);
  return String(v);
}

// POST a JSON object (the traces cursor grows with the running trials: it goes in the body).
async function postJSON(url, obj) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(obj) });
  const body = await r.json();
  await DOM_READY;
  if (!r.ok) throw new Error(body.error || (r.status + " " + r.statusText));
  return body;
}

// The page's state lives in the query string: read it once, write it on every change
// (replaceState: a reload or a shared link reproduces the view; no history entry per click).
function urlState() { return new URLSearchParams(window.location.search); }
function writeURL(values) {
  const q = new URLSearchParams();
  Object.entries(values).forEach(([k, v]) => { if (v !== null && v !== undefined && v !== "") q.set(k, String(v)); });
  const s = q.toString();
  history.replaceState(null, "", window.location.pathname + (s ? "?" + s : ""));
}

// Set a <select> to value when it has that option (a link may name one this sweep lacks).
function choose(select, value) {
  if (value !== null && value !== undefined && [...select.options].some(o => o.value === value)) select.value = value;
}

// Exponential moving average of a series (TensorBoard's smoothing, debiased so the first
// points are not pulled towards zero); nulls stay null and do not move the average.
function ema(ys, w) {
  if (!w) return ys.slice();
  let s = 0, n = 0;
  return ys.map(v => {
    if (v === null || v === undefined || !isFinite(v)) return v;
    s = w * s + (1 - w) * v; n++;
    return s / (1 - Math.pow(w, n));
  });
}
