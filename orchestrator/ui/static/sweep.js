// The sweep page: per-seed traces coloured by a chosen parameter, faceted by another,
// filtered by a --where condition; the trial table; Kaplan-Meier curves from the server.
// New eval rows arrive through the incremental traces endpoint and are appended in place.
const state = { trials: [], traces: {}, cursor: null, where: "", sort: ["key", 1],
                kmAt: 0, kmDirty: false, busy: false };
const $ = id => document.getElementById(id);

// Own properties only: a parameter named "constructor" is a parameter, not Object's.
const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
function param(t, name) { return name && own(t.params, name) ? t.params[name] : null; }
function label(v) { return v === null || v === undefined ? "(none)" : typeof v === "object" ? JSON.stringify(v) : String(v); }

function groupsOf(name) {
  const seen = [];
  for (const t of state.trials) { const g = label(param(t, name)); if (!seen.includes(g)) seen.push(g); }
  const nums = seen.every(g => g !== "" && !isNaN(Number(g)));
  return seen.sort((a, b) => nums ? Number(a) - Number(b) : a.localeCompare(b));
}

function showError(msg) { $("error").textContent = msg || ""; }

function drawTraces() {
  const g = $("group").value, f = $("facet").value;
  const groups = groupsOf(g), facets = f ? groupsOf(f) : [null];
  const holder = $("plots");
  const wanted = facets.map((v, i) => "facet-" + i);
  // Reuse facet divs across refreshes: Plotly.react then only diffs the data.
  [...holder.children].forEach(d => { if (!wanted.includes(d.id)) { Plotly.purge(d); d.remove(); } });
  const width = facets.length > 1 ? Math.max(420, Math.floor((window.innerWidth - 60) / Math.min(facets.length, 3))) : null;
  facets.forEach((fv, i) => {
    let div = document.getElementById("facet-" + i);
    if (!div) { div = document.createElement("div"); div.id = "facet-" + i; div.className = "facet"; holder.appendChild(div); }
    div.style.width = facets.length > 1 ? "" : "100%";
    const shown = new Set(), data = [], loss = [];
    for (const t of state.trials) {
      if (f && label(param(t, f)) !== fv) continue;
      const tr = state.traces[t.trial_id] || { step: [], acc: [], loss: [] };
      const gv = label(param(t, g)), color = PALETTE[groups.indexOf(gv) % PALETTE.length];
      // Names and hover text are Plotly's pseudo-HTML: stored strings go in through plotText.
      const name = plotText(gv), who = plotText(t.key);
      data.push({ type: "scatter", mode: "lines", uid: "acc-" + t.trial_id, x: tr.step.slice(), y: tr.acc.slice(),
                  xaxis: "x", yaxis: "y", name: name, legendgroup: gv, showlegend: !shown.has(gv),
                  line: { color: color, width: 1.2 }, hovertemplate: who + " " + plotText(g) + "=" + name + "<br>step %{x}: acc %{y:.3f}<extra></extra>" });
      loss.push({ type: "scatter", mode: "lines", uid: "loss-" + t.trial_id, x: tr.step.slice(), y: tr.loss.slice(),
                  xaxis: "x2", yaxis: "y2", name: name, legendgroup: gv, showlegend: false,
                  line: { color: color, width: 1.2 }, hovertemplate: who + "<br>step %{x}: loss %{y:.3f}<extra></extra>" });
      shown.add(gv);
    }
    const layout = {
      title: { text: f ? plotText(f + " = " + fv) : "accuracy and loss per trial", font: { size: 14 } },
      grid: { rows: 2, columns: 1, pattern: "independent" }, height: 560, width: width,
      margin: { t: 40, r: 10, b: 40, l: 50 }, legend: { title: { text: plotText(g) } },
      yaxis: { title: { text: "acc" }, range: [0, 1.02] }, yaxis2: { title: { text: "loss" } },
      xaxis2: { title: { text: "step" } }, uirevision: g + "|" + f,
    };
    Plotly.react(div, data.concat(loss), layout, { displaylogo: false, responsive: true });
  });
}

function drawTable() {
  const varying = state.varying || [];
  const cols = ["key"].concat(varying, ["status", "step", "final_acc", "best_acc", "error"]);
  const hr = document.createElement("tr");
  cols.forEach(c => {
    const th = el("th", c + (state.sort[0] === c ? (state.sort[1] > 0 ? " ▲" : " ▼") : ""));
    th.dataset.col = c;
    th.onclick = () => { state.sort = [c, state.sort[0] === c ? -state.sort[1] : 1]; drawTable(); };
    hr.appendChild(th);
  });
  $("trials").tHead.replaceChildren(hr);
  const val = (t, c) => c === "step" ? t.step : (own(t, c) && c !== "params") ? t[c] : param(t, c);
  const [sc, dir] = state.sort;
  const rows = state.trials.slice().sort((a, b) => {
    const x = val(a, sc), y = val(b, sc);
    if (x === y) return 0; if (x === null || x === undefined) return 1; if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  const body = $("trials").tBodies[0];
  body.replaceChildren();
  for (const t of rows) {
    const tr = document.createElement("tr");
    cols.forEach(c => {
      const td = document.createElement("td");
      if (c === "key") {
        const a = document.createElement("a");
        a.href = "/sweeps/" + encodeURIComponent(PAGE.sweep) + "/trials/" + encodeURIComponent(t.key);
        a.textContent = t.key; a.className = "trial-link"; td.appendChild(a);
      } else if (c === "status") {
        td.appendChild(el("span", t.status, "st st-" + t.status));
      } else if (c === "step") {
        td.textContent = fmt(t.step) + " / " + fmt(t.steps);
      } else { td.textContent = fmt(val(t, c)); }
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
  $("ntrials").textContent = "(" + state.trials.length + ")";
}

async function drawKM() {
  state.kmAt = Date.now();
  // Answers can come back out of order (a regroup while the last one is computed): draw
  // only the newest request's.
  const seq = state.kmSeq = (state.kmSeq || 0) + 1;
  const g = $("group").value;
  const q = new URLSearchParams({ by: g }); if (state.where) q.set("where", state.where);
  try {
    const km = await getJSON(apiBase() + "/km?" + q);
    if (seq !== state.kmSeq) return;
    const groups = Object.keys(km.groups);
    const data = groups.map((name, i) => {
      const s = km.groups[name].survival;
      return { type: "scatter", mode: "lines", line: { shape: "hv", color: PALETTE[i % PALETTE.length] },
               x: s.map(p => p[0]), y: s.map(p => p[1]), name: plotText(name + " (n " + km.groups[name].n + ", escapes " + km.groups[name].escapes + ")") };
    });
    Plotly.react($("km"), data, {
      height: 320, margin: { t: 20, r: 10, b: 40, l: 50 }, legend: { title: { text: plotText(g) } },
      xaxis: { title: { text: "step" } }, yaxis: { title: { text: plotText("not yet escaped (acc < " + km.escape_at + ")") }, range: [0, 1.02] },
    }, { displaylogo: false });
    $("logrank").textContent = km.logrank
      ? "log-rank (" + km.logrank.kind + ") p = " + km.logrank.p_value.toPrecision(3) + ", chi2 = " + km.logrank.test_statistic.toFixed(2)
      : "log-rank: needs two groups";
  } catch (e) { if (seq === state.kmSeq) { $("logrank").textContent = e.message; Plotly.purge($("km")); } }
}

// Colour-by lists the parameters that vary first, then the rest; facet-by the varying ones.
function fillControls(t) {
  const g = $("group"), f = $("facet");
  if (g.options.length) return;
  const rest = t.params.filter(p => !t.varying.includes(p));
  t.varying.concat(rest).forEach(p => g.add(new Option(p, p)));
  t.varying.forEach(p => f.add(new Option(p, p)));
}

async function reload() {
  state.where = $("where").value.trim();
  const q = new URLSearchParams(); if (state.where) q.set("where", state.where);
  try {
    const t = await getJSON(apiBase() + "/trials?" + q);
    state.trials = t.trials; state.varying = t.varying; state.traces = {}; state.cursor = null;
    fillControls(t);
    const tr = await getJSON(apiBase() + "/traces?" + q);
    mergeTraces(state.traces, tr); state.cursor = tr.cursor;
    showError("");
  } catch (e) { showError(e.message); return; }
  drawTraces(); drawTable(); drawKM();
}

async function poll() {
  if (state.busy || state.cursor === null) return;
  state.busy = true;
  try {
    const q = new URLSearchParams({ since: state.cursor }); if (state.where) q.set("where", state.where);
    const tr = await getJSON(apiBase() + "/traces?" + q);
    state.cursor = tr.cursor;
    const anyRunning = state.trials.some(t => t.status === "running" || t.status === "pending");
    if (tr.n > 0 || anyRunning) {
      mergeTraces(state.traces, tr);
      const q2 = new URLSearchParams(); if (state.where) q2.set("where", state.where);
      const t = await getJSON(apiBase() + "/trials?" + q2);
      state.trials = t.trials; state.varying = t.varying;
      if (tr.n > 0) { drawTraces(); state.kmDirty = true; }
      drawTable();
    }
    // The escape-time view costs a full analysis pass: redraw it at most every 10 s, but
    // always once after the last new rows.
    if (state.kmDirty && Date.now() - state.kmAt > 10000) { state.kmDirty = false; drawKM(); }
    $("live").textContent = "live: " + tr.n + " new rows at " + tr.now;
  } catch (e) { $("live").textContent = "live: " + e.message; }
  finally { state.busy = false; }
}

// The form never submits (the CSP's form-action 'none' would refuse it anyway): apply and
// Enter reload in place.
$("controls").addEventListener("submit", e => e.preventDefault());
$("apply").onclick = reload;
$("where").addEventListener("keydown", e => { if (e.key === "Enter") reload(); });
$("group").onchange = () => { drawTraces(); drawKM(); };
$("facet").onchange = drawTraces;
reload();
setInterval(poll, POLL_MS);
