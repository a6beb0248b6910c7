// Shared by the sweep and trial pages: fetch JSON, and merge incremental trace rows.
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

async function getJSON(url) {
  const r = await fetch(url);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || (r.status + " " + r.statusText));
  return body;
}

function apiBase() { return "/api/sweeps/" + encodeURIComponent(window.SWEEP); }

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
