// The sweep page: accuracy and loss traces coloured by a chosen parameter, faceted by another,
// filtered by a --where condition, smoothed and on linear or log axes; the grid of lock-in or
// escape per cell (click a cell for its traces); Kaplan-Meier curves; the paged trial table.
// New eval rows arrive through the incremental traces endpoint and are appended in place.
// Parallel coordinates of the swept parameters coloured by an outcome, the parameters'
// fANOVA importance, and an overlay of the trials ticked in the table.
// Everything the user picks is in the query string (writeURL), so a link reproduces the view.
// A paged view (past PAGED_TRIALS trials) holds one page of the table in `trials`, sorted by
// the server; the rows it needs off that page (the overlay's, a grid cell's) are fetched by
// trial id or key and kept in byId/byKey (absentIds/absentKeys: asked for, not in the view).
const state = { trials: [], traces: {}, cursor: null, where: "", sort: ["key", 1], page: 0,
                kmAt: 0, kmDirty: false, busy: false, grid: null, cell: null, gridAt: 0,
                overlay: [], pc: null, pcAxes: null, pcSel: {},
                paged: false, total: 0, byId: new Map(), byKey: new Map(), absentIds: new Set(), absentKeys: new Set() };
const $ = id => document.getElementById(id);
const PAGE_ROWS = 100;
// Above these, the traces are drawn with WebGL (scattergl); below, as SVG (crisper, and each
// point's hover text names its trial).
const GL_TRIALS = 300, GL_POINTS = 30000, HOVER_KEYS_MAX = 3000;
const SVG_POINTS = 60000;
const PLOT_CONFIG = { displaylogo: false, responsive: true, plotGlPixelRatio: 1 };
// The first load asks the server to thin the traces past this many points (every k-th eval
// of each trial and its last; the trial page and the CSV have every point).
const MAX_POINTS = 250000;
// Past this many trials in the view the traces plot shows quantile bands per colour group
// (computed by the server) instead of a line per trial: 10,000 SVG or software-WebGL lines
// take a browser many seconds. The grid cell and the overlay still draw a line per trial,
// fetching just those trials' traces.
const BAND_TRIALS = 200;
// Past this many trials in the view the server hands the table out a page at a time, sorted
// by it (orchestrator/ui/table.py), and at most this many rows by id or key per request.
const PAGED_TRIALS = Number(PAGE.pagedTrials) || 5000, PICK_ROWS = PAGED_TRIALS;
// A trial row's own columns: a table column by any other name is a parameter (params.NAME
// to the server), as `val` in drawTable reads it.
const ROW_COLUMNS = new Set(["trial_id", "key", "status", "steps", "step", "final_acc", "final_loss", "best_acc",
                             "error", "host", "device", "started_at", "updated_at"]);

// Own properties only: a parameter named "constructor" is a parameter, not Object's.
const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
function param(t, name) { return name && own(t.params, name) ? t.params[name] : null; }
function label(v) { return v === null || v === undefined ? "(none)" : typeof v === "object" ? JSON.stringify(v) : String(v); }

function groupsOf(name, trials) {
  const seen = new Set();
  for (const t of trials || state.trials) seen.add(label(param(t, name)));
  return sortLabels([...seen]);
}
function sortLabels(all) {
  const nums = all.every(g => g !== "" && !isNaN(Number(g)));
  return all.sort((a, b) => nums ? Number(a) - Number(b) : a.localeCompare(b));
}
// A paged view's colour groups and facets: from the bands answer, which counts every trial
// of the view (the page holds a hundred of them).
function bandGroups(b) { return sortLabels([...new Set(b.panels.flatMap(p => p.groups.map(e => label(e.value))))]); }
function bandFacets(b) { return sortLabels([...new Set(b.panels.map(p => label(p.value)))]); }

function showError(msg) {
  $("error").textContent = msg || "";
  // A rejected filter leaves the last good view on screen, greyed out, until one applies.
  $("views").classList.toggle("stale", Boolean(msg));
}

// ---- URL state -------------------------------------------------------------------------------
const INITIAL = urlState();
function saveURL() {
  writeURL({
    color: $("group").value, facet: $("facet").value, where: state.where,
    xscale: $("xscale").value === "log" ? "log" : "", acc: $("accscale").value === "log" ? "log" : "",
    loss: $("lossscale").value === "log" ? "log" : "", smooth: Number($("smooth").value) || "",
    gx: $("gx").value, gy: $("gy").value, gf: $("gf").value, gm: $("gm").value === "lockin" ? "" : $("gm").value,
    cell: state.cell ? JSON.stringify(state.cell) : "",
    sort: state.sort[0] === "key" && state.sort[1] > 0 ? "" : (state.sort[1] < 0 ? "-" : "") + state.sort[0],
    page: state.page || "",
    pc: $("pc-outcome").value === "final_acc" ? "" : $("pc-outcome").value,
    pcaxes: state.pcAxes ? JSON.stringify(state.pcAxes) : "",
    pcsel: Object.keys(state.pcSel).length ? JSON.stringify(state.pcSel) : "",
    overlay: state.overlay.join(","),
  });
  updateCSVLinks();
}
function restoreScalars() {
  choose($("xscale"), INITIAL.get("xscale"));
  choose($("accscale"), INITIAL.get("acc"));
  choose($("lossscale"), INITIAL.get("loss"));
  choose($("gm"), INITIAL.get("gm"));
  const sm = Number(INITIAL.get("smooth"));
  if (sm > 0 && sm < 1) $("smooth").value = String(sm);
  $("smooth-value").textContent = $("smooth").value;
  const s = INITIAL.get("sort");
  if (s) state.sort = s.startsWith("-") ? [s.slice(1), -1] : [s, 1];
  state.page = Math.max(0, parseInt(INITIAL.get("page") || "0", 10) || 0);
  try { const c = JSON.parse(INITIAL.get("cell") || "null"); if (c && typeof c === "object") state.cell = c; } catch (e) { /* ignore */ }
  $("where").value = INITIAL.get("where") || "";
  choose($("pc-outcome"), INITIAL.get("pc"));
  state.pcAxes = jsonList(INITIAL.get("pcaxes"));
  try {
    const sel = JSON.parse(INITIAL.get("pcsel") || "{}");
    if (sel && typeof sel === "object" && !Array.isArray(sel)) {
      for (const k of Object.keys(sel)) if (Array.isArray(sel[k])) state.pcSel[k] = sel[k].map(String);
    }
  } catch (e) { /* a mangled link: no filter */ }
  const keys = [...new Set((INITIAL.get("overlay") || "").split(",").filter(k => k))];
  if (keys.length > MAX_OVERLAY) {
    $("overlay-error").textContent = "the link names " + keys.length + " trials; the overlay holds at most " + MAX_OVERLAY + ": the first " + MAX_OVERLAY + " are kept";
  }
  state.overlay = keys.slice(0, MAX_OVERLAY);
}
// A JSON list of strings from the URL, or null.
function jsonList(text) {
  try { const v = JSON.parse(text || "null"); return Array.isArray(v) ? v.map(String) : null; } catch (e) { return null; }
}

function updateCSVLinks() {
  const q = new URLSearchParams(); if (state.where) q.set("where", state.where);
  const base = apiBase() + "/csv/";
  $("csv-traces").href = base + "traces?" + q;
  $("csv-trials").href = base + "trials?" + q;
  const k = new URLSearchParams(q); k.set("by", $("group").value);
  $("csv-km").href = base + "km?" + k;
  const g = gridQuery();
  $("csv-grid").href = g ? base + "grid?" + g : "";
  $("csv-outcomes").href = base + "outcomes?" + q;
  const o = new URLSearchParams(q); o.set("outcome", $("pc-outcome").value);
  $("csv-importance").href = base + "importance?" + o;
}

// ---- traces ----------------------------------------------------------------------------------
// One trace per colour group (and facet) holding every trial's line, split by nulls: a few
// dozen traces for 10,000 trials, where one per trial would stall the browser.
function groupedTraces(trials, g, groups, smooth, gl, axis) {
  const byGroup = new Map();
  const withKeys = trials.length <= HOVER_KEYS_MAX;
  // The break between two trials: SVG lines break at null, WebGL lines only at NaN.
  const gap = gl ? NaN : null;
  // SVG (no WebGL) past SVG_POINTS: every k-th point of each trial and its last.
  let total = 0;
  if (!gl) for (const t of trials) { const tr = state.traces[t.trial_id]; if (tr) total += tr.step.length; }
  const every = gl ? 1 : Math.max(1, Math.ceil(total / SVG_POINTS));
  for (const t of trials) {
    // Every trial counts in its group (meta.trials), a pending one with no points yet too.
    const gv = label(param(t, g));
    let e = byGroup.get(gv);
    if (!e) { e = { x: [], acc: [], loss: [], text: [], n: 0, lines: 0 }; byGroup.set(gv, e); }
    e.n++;
    const tr = state.traces[t.trial_id];
    if (!tr || !tr.step.length) continue;
    const acc = ema(tr.acc, smooth), loss = ema(tr.loss, smooth), who = plotText(t.key);
    if (e.lines++) { e.x.push(gap); e.acc.push(gap); e.loss.push(gap); if (withKeys) e.text.push(""); }
    const last = tr.step.length - 1;
    for (let i = 0; i <= last; i++) {
      if (every > 1 && i % every && i !== last) continue;
      e.x.push(tr.step[i]); e.acc.push(acc[i]); e.loss.push(loss[i]); if (withKeys) e.text.push(who);
    }
  }
  const type = gl ? "scattergl" : "scatter", data = [], loss = [];
  for (const gv of groups) {
    const e = byGroup.get(gv);
    if (!e) continue;
    const gi = groups.indexOf(gv), color = PALETTE[gi % PALETTE.length];
    // Names and hover text are Plotly's pseudo-HTML: stored strings go in through plotText.
    const name = plotText(gv), who = withKeys ? "%{text} " : "";
    // uids and legend groups end up in Plotly's CSS selectors: numbers, never a stored string.
    const common = { type: type, mode: "lines", x: e.x, name: name, legendgroup: "g" + gi, connectgaps: false,
                     line: { color: color, width: gl ? 1 : 1.2 }, meta: { trials: e.n } };
    if (withKeys) common.text = e.text;
    data.push(Object.assign({}, common, { uid: "acc-" + axis + "-" + gi, y: e.acc, xaxis: "x", yaxis: "y", showlegend: true,
      hovertemplate: who + plotText(g) + "=" + name + "<br>step %{x}: acc %{y:.3f}<extra></extra>" }));
    loss.push(Object.assign({}, common, { uid: "loss-" + axis + "-" + gi, y: e.loss, xaxis: "x2", yaxis: "y2", showlegend: false,
      hovertemplate: who + "<br>step %{x}: loss %{y:.3f}<extra></extra>" }));
  }
  const out = data.concat(loss);
  out.every = every;  // for the title: how many evals of each trial one drawn point stands for
  return out;
}

// Ask for a WebGL context as the page starts: the first one a browser makes can take a
// while (a software renderer starting), and Plotly gives up on a context that is not there
// when it draws. A page whose WebGL still fails draws SVG instead (see drawTraces).
const GL_PROBE = (() => { try { return Boolean(document.createElement("canvas").getContext("webgl")); } catch (e) { return false; } })();

function useGL() {
  if (!GL_PROBE || state.glFailed >= GL_RETRIES) return false;
  let points = 0;
  for (const id in state.traces) points += state.traces[id].step.length;
  return state.trials.length > GL_TRIALS || points > GL_POINTS;
}

function traceLayout(title, legendTitle, width, height) {
  const xs = $("xscale").value, as = $("accscale").value, ls = $("lossscale").value;
  return {
    title: { text: title, font: { size: 14 } },
    grid: { rows: 2, columns: 1, pattern: "independent" }, height: height || 560, width: width,
    margin: { t: 40, r: 10, b: 40, l: 50 }, legend: { title: { text: legendTitle } },
    xaxis: { type: xs }, xaxis2: { title: { text: "step" }, type: xs },
    yaxis: as === "log" ? { title: { text: "acc" }, type: "log" } : { title: { text: "acc" }, range: [0, 1.02] },
    yaxis2: { title: { text: "loss" }, type: ls },
    uirevision: [$("group").value, $("facet").value, xs, as, ls].join("|"),
  };
}

function drawTraces() {
  if (state.big) { drawBands(); return; }
  $("traces-note").textContent = "";
  const g = $("group").value, f = $("facet").value, smooth = Number($("smooth").value) || 0, gl = useGL();
  const groups = groupsOf(g), facets = f ? groupsOf(f) : [null];
  const holder = $("plots");
  const wanted = facets.map((v, i) => "facet-" + i);
  // Reuse facet divs across refreshes: Plotly.react then only diffs the data.
  [...holder.children].forEach(d => { if (!wanted.includes(d.id)) { Plotly.purge(d); d.remove(); } });
  const drawn = [];
  const width = facets.length > 1 ? Math.max(420, Math.floor((window.innerWidth - 60) / Math.min(facets.length, 3))) : null;
  facets.forEach((fv, i) => {
    let div = document.getElementById("facet-" + i);
    if (!div) { div = document.createElement("div"); div.id = "facet-" + i; div.className = "facet"; holder.appendChild(div); }
    div.style.width = facets.length > 1 ? "" : "100%";
    const mine = f ? state.trials.filter(t => label(param(t, f)) === fv) : state.trials;
    const data = groupedTraces(mine, g, groups, smooth, gl, i);
    const thin = (state.stride || 1) * data.every;
    const note = (smooth ? " (EMA " + smooth + ")" : "") + (thin > 1 ? " (1 eval in " + thin + " shown)" : "");
    const title = (f ? plotText(f + " = " + fv) : "accuracy and loss per trial") + note;
    // plotGlPixelRatio 1: a quarter of the pixels to a WebGL canvas (Plotly's default is 2),
    // which a software renderer needs for 10,000 lines.
    drawn.push(Plotly.react(div, data, traceLayout(title, plotText(g), width), PLOT_CONFIG)
      .then(() => { if (div.querySelector(".no-webgl")) failedGL(div); }));
  });
  // The first time the traces are on screen (the table is drawn first): the figure
  // `orchestrator bench ui --browser` and the browser tests read.
  Promise.all(drawn).then(() => { if (!state.glRetry && !document.body.dataset.drawn) document.body.dataset.drawn = String(performance.now()); });
}

// ---- quantile bands (a big sweep) ---------------------------------------------------------------
function bandQuery(where, by, facet) {
  const q = new URLSearchParams(); if (where) q.set("where", where);
  if (by) q.set("by", by); if (facet) q.set("facet", facet);
  return q;
}

function rgba(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
}

// The bands for the picked colour and facet, fetched when the ones held are for others.
async function drawBands() {
  const g = $("group").value, f = $("facet").value || null, b = state.bands;
  if (!b || b.by !== g || b.facet !== f || state.bandsWhere !== state.where) {
    const seq = state.bandSeq = (state.bandSeq || 0) + 1, where = state.where;
    let nb;
    try { nb = await getJSON(apiBase() + "/bands?" + bandQuery(where, g, f)); }
    catch (e) {
      if (seq === state.bandSeq) {
        $("traces-note").textContent = e.message;
        [...$("plots").children].forEach(d => { Plotly.purge(d); d.remove(); });
      }
      return;
    }
    if (seq !== state.bandSeq || !state.big) return;
    state.bands = nb; state.bandsWhere = where;
  }
  renderBands();
}

// Per facet a plot of acc over loss; per colour group the median at each eval step as a line
// and the 25-75 % and 10-90 % of the trials with an eval there as shaded bands.
function renderBands() {
  const b = state.bands, g = $("group").value, f = $("facet").value, smooth = Number($("smooth").value) || 0;
  const groups = state.paged ? bandGroups(b) : groupsOf(g), facets = f ? (state.paged ? bandFacets(b) : groupsOf(f)) : [null];
  const holder = $("plots");
  const wanted = facets.map((v, i) => "facet-" + i);
  [...holder.children].forEach(d => { if (!wanted.includes(d.id)) { Plotly.purge(d); d.remove(); } });
  const width = facets.length > 1 ? Math.max(420, Math.floor((window.innerWidth - 60) / Math.min(facets.length, 3))) : null;
  const drawn = [];
  facets.forEach((fv, i) => {
    let div = document.getElementById("facet-" + i);
    if (!div) { div = document.createElement("div"); div.id = "facet-" + i; div.className = "facet"; holder.appendChild(div); }
    div.style.width = facets.length > 1 ? "" : "100%";
    const panel = b.panels.find(p => !f || label(p.value) === fv);
    const bands = [], lines = [], loss = [];
    let nTrials = 0;
    (panel ? panel.groups : []).forEach(e => {
      const gv = label(e.value), gi = groups.indexOf(gv), color = PALETTE[Math.max(0, gi) % PALETTE.length];
      const name = plotText(gv), x = e.step, back = x.slice().reverse();
      nTrials += e.trials;
      [["acc", "x", "y", lines], ["loss", "x2", "y2", loss]].forEach(([m, xa, ya, out]) => {
        const s = p => ema(e[m + "_q" + p], smooth);
        [[10, 90, 0.12], [25, 75, 0.28]].forEach(([lo, hi, alpha]) => {
          bands.push({ type: "scatter", mode: "lines", uid: "band" + hi + "-" + m + "-" + i + "-" + gi, x: x.concat(back),
            y: s(hi).concat(s(lo).reverse()), fill: "toself", fillcolor: rgba(color, alpha), line: { width: 0 },
            xaxis: xa, yaxis: ya, hoverinfo: "skip", showlegend: false, legendgroup: "g" + gi });
        });
        // uid "acc-": the line count the browser tests read is meta.trials over these.
        out.push({ type: "scatter", mode: "lines", uid: m + "-" + i + "-" + gi, x: x, y: s(50), customdata: e.n,
          name: name + " (" + e.trials + ")", legendgroup: "g" + gi, showlegend: m === "acc", xaxis: xa, yaxis: ya,
          line: { color: color, width: 2 }, meta: { trials: e.trials, band: true },
          hovertemplate: plotText(g) + "=" + name + "<br>step %{x}: median " + m + " %{y:.3f} of %{customdata} trials<extra></extra>" });
      });
    });
    const note = " (median, 25-75 % and 10-90 %" + (smooth ? "; EMA " + smooth : "") + ")";
    const title = (f ? plotText(f + " = " + fv) + ": " : "") + "quantile bands of " + nTrials + " trials" + note;
    drawn.push(Plotly.react(div, bands.concat(lines, loss), traceLayout(title, plotText(g), width), PLOT_CONFIG));
  });
  const ng = new Set(b.panels.flatMap(p => p.groups.map(e => label(e.value)))).size;
  $("traces-note").textContent = "quantile bands of " + b.n_trials + " trials in " + ng + " group(s) by " + g +
    (f ? ", faceted by " + f : "") + " (more than " + BAND_TRIALS + " trials: bands instead of a line per trial): " +
    "per eval step the median line, the 25-75 % and 10-90 % of the trials shaded. Pick trials to overlay: tick them in the table, or click a grid cell.";
  Promise.all(drawn).then(() => { if (!document.body.dataset.drawn) document.body.dataset.drawn = String(performance.now()); });
}

// The traces of these trials, fetched where the page lacks them (a big sweep's page holds
// only the ones it draws a line each for). A trial with no eval rows gets empty columns.
async function ensureTraces(ids, maxPoints) {
  const need = ids.filter(id => !own(state.traces, id));
  if (!need.length) return;
  const body = { ids: need.join(",") }; if (maxPoints) body.max_points = String(maxPoints);
  const tr = await postJSON(apiBase() + "/traces", body);
  mergeTraces(state.traces, tr);
  need.forEach(id => { if (!own(state.traces, id)) state.traces[id] = { step: [], acc: [], loss: [] }; });
}

// Plotly could not set up WebGL (seen in headless Chromium's software renderer while a big
// page loads): try again from scratch after 0.5 s, then draw SVG instead.
const GL_RETRIES = 2;
function failedGL(div) {
  Plotly.purge(div);
  div.replaceChildren();  // purge leaves Plotly's "WebGL is not supported" box behind
  if (state.glRetry) return;
  state.glFailed = (state.glFailed || 0) + 1;
  const wait = 500 * Math.pow(2, state.glFailed - 1);
  state.glRetry = setTimeout(() => { state.glRetry = null; drawTraces(); drawCell(); }, wait);
}

// ---- the trial table (paged: a 10,000-row table is ten thousand rows of DOM) -------------------
function drawTable() {
  if (state.paged) { drawPage(); return; }
  const varying = state.varying || [];
  const cols = ["key"].concat(varying, ["status", "step", "final_acc", "best_acc", "error"]);
  tableHead(cols, () => { drawTable(); saveURL(); });
  const val = (t, c) => c === "step" ? t.step : (own(t, c) && c !== "params") ? t[c] : param(t, c);
  const [sc, dir] = state.sort;
  const rows = state.trials.slice().sort((a, b) => {
    const x = val(a, sc), y = val(b, sc);
    if (x === y) return 0; if (x === null || x === undefined) return 1; if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  state.page = Math.min(state.page, pages - 1);
  const shown = rows.slice(state.page * PAGE_ROWS, (state.page + 1) * PAGE_ROWS);
  const body = $("trials").tBodies[0];
  body.replaceChildren(...shown.map(t => tableRow(t, cols, val)));
  $("ntrials").textContent = "(" + state.trials.length + ")";
  $("page").textContent = "page " + (state.page + 1) + " of " + pages;
  $("rows").textContent = "";
  $("prev").disabled = state.page === 0; $("next").disabled = state.page >= pages - 1;
}

// The header (a click sorts by the column: ascending, again descending) and a row.
function tableHead(cols, sorted) {
  const hr = document.createElement("tr");
  hr.appendChild(el("th", "overlay", "overlay-head"));
  cols.forEach(c => {
    const th = el("th", c + (state.sort[0] === c ? (state.sort[1] > 0 ? " ▲" : " ▼") : ""));
    th.dataset.col = c;
    th.onclick = () => { state.sort = [c, state.sort[0] === c ? -state.sort[1] : 1]; state.page = 0; sorted(); };
    hr.appendChild(th);
  });
  $("trials").tHead.replaceChildren(hr);
}

function tableRow(t, cols, val) {
  const tr = document.createElement("tr");
  const pick = document.createElement("input");
  pick.type = "checkbox"; pick.className = "overlay-pick"; pick.dataset.key = t.key;
  pick.checked = state.overlay.includes(t.key);
  pick.onchange = () => toggleOverlay(t.key, pick);
  const ptd = document.createElement("td"); ptd.appendChild(pick); tr.appendChild(ptd);
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
  return tr;
}

// A paged view's table: the server's page as it sorted it; a header click or prev/next asks
// it for another (loadPage).
function drawPage() {
  const cols = ["key"].concat(state.varying || [], ["status", "step", "final_acc", "best_acc", "error"]);
  tableHead(cols, () => loadPage());
  const val = (t, c) => c === "step" ? t.step : (own(t, c) && c !== "params") ? t[c] : param(t, c);
  const body = $("trials").tBodies[0];
  body.replaceChildren(...state.trials.map(t => tableRow(t, cols, val)));
  const n = state.total, pages = Math.max(1, Math.ceil(n / state.size)), first = state.page * state.size;
  const num = v => v.toLocaleString("en-US");
  $("ntrials").textContent = "(" + num(n) + ")";
  $("page").textContent = "page " + (state.page + 1) + " of " + pages;
  $("rows").textContent = "rows " + num(Math.min(n, first + 1)) + "–" + num(first + state.trials.length) + " of " + num(n);
  $("prev").disabled = state.page === 0; $("next").disabled = state.page >= pages - 1;
}

// The trials query: `where`, and for a paged view the page and sort asked for.
function trialsQuery(where, paged) {
  const q = new URLSearchParams(); if (where) q.set("where", where);
  if (paged) {
    const c = state.sort[0];
    q.set("page", String(state.page)); q.set("size", String(PAGE_ROWS));
    q.set("sort", ROW_COLUMNS.has(c) ? c : "params." + c); q.set("dir", state.sort[1] < 0 ? "-1" : "1");
  }
  return q;
}

// The view's trials: the whole table (at most PAGED_TRIALS trials) or one page of it. `guess`
// (paged or not: the last view's, or the shell's count) saves a request when it is right.
async function fetchTrials(where, guess) {
  const ask = paged => getJSON(apiBase() + "/trials?" + trialsQuery(where, paged));
  let t;
  try { t = await ask(guess); }
  catch (e) {
    // A link's sort this sweep lacks: the default order instead (an unpaged table sorts by
    // a column it lacks as all empty; the server refuses it).
    if (!guess || !e.message.startsWith("error: sort=")) throw e;
    state.sort = ["key", 1]; state.page = 0;
    t = await ask(true);
  }
  if (guess && t.total <= PAGED_TRIALS) return ask(false);
  // Unasked, the server answers page 0 by key: another page or order needs a second request.
  if (!guess && t.paged && (state.page || state.sort[0] !== "key" || state.sort[1] < 0)) return fetchTrials(where, true);
  return t;
}

// Take a trials answer: the whole table, or a page of it (its rows kept by id and key too).
function takeTrials(t) {
  state.paged = Boolean(t.paged); state.varying = t.varying;
  if (t.paged) {
    state.trials = t.rows; state.total = t.total; state.page = t.page; state.size = t.size;
    remember(t.rows);
  } else {
    state.trials = t.trials; state.total = t.trials.length;
    state.byId.clear(); state.byKey.clear();
  }
}

function remember(rows) { rows.forEach(r => { state.byId.set(r.trial_id, r); state.byKey.set(r.key, r); }); }
function forgetRows() { state.byId.clear(); state.byKey.clear(); state.absentIds.clear(); state.absentKeys.clear(); }

// Another page (or order) of a paged view; only the newest request's answer is drawn.
async function loadPage() {
  const seq = state.pageSeq = (state.pageSeq || 0) + 1;
  let t;
  try { t = await getJSON(apiBase() + "/trials?" + trialsQuery(state.where, true)); }
  catch (e) { if (seq === state.pageSeq) $("rows").textContent = e.message; return; }
  if (seq !== state.pageSeq || !state.paged) return;
  takeTrials(t); drawTable(); saveURL();
}

// The rows of these trials (ids or keys) a paged view lacks, fetched PICK_ROWS at a time;
// those the view does not have are noted, so that they are asked for once.
async function ensureRows(field, wanted) {
  const have = field === "ids" ? state.byId : state.byKey, absent = field === "ids" ? state.absentIds : state.absentKeys;
  const need = [...new Set(wanted)].filter(v => !have.has(v) && !absent.has(v));
  const where = state.where, asks = [];
  for (let i = 0; i < need.length; i += PICK_ROWS) {
    const body = { [field]: need.slice(i, i + PICK_ROWS) }; if (where) body.where = where;
    asks.push(postJSON(apiBase() + "/trials", body));
  }
  const answers = await Promise.all(asks);
  if (where !== state.where) return;
  answers.forEach(a => remember(a.trials));
  need.forEach(v => { if (!have.has(v)) absent.add(v); });
}

// ---- escape times ----------------------------------------------------------------------------
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
      xaxis: { title: { text: "step" }, type: $("xscale").value },
      yaxis: { title: { text: plotText("not yet escaped (acc < " + km.escape_at + ")") }, range: [0, 1.02] },
    }, { displaylogo: false });
    $("logrank").textContent = km.logrank
      ? "log-rank (" + km.logrank.kind + ") p = " + km.logrank.p_value.toPrecision(3) + ", chi2 = " + km.logrank.test_statistic.toFixed(2)
      : "log-rank: needs two groups";
  } catch (e) { if (seq === state.kmSeq) { $("logrank").textContent = e.message; Plotly.purge($("km")); } }
}

// ---- the grid --------------------------------------------------------------------------------
function gridQuery() {
  const x = $("gx").value, y = $("gy").value;
  if (!x || !y || x === y) return null;
  const q = new URLSearchParams({ x: x, y: y });
  if ($("gf").value) q.set("facet", $("gf").value);
  q.set("metric", $("gm").value === "lockin" ? "lockin" : "escape_median");
  if (state.where) q.set("where", state.where);
  return q;
}

function cellValue(c, shown) {
  if (shown === "escape_median") return c.median;
  return c.rate;
}

async function drawGrid() {
  state.gridAt = Date.now();
  const seq = state.gridSeq = (state.gridSeq || 0) + 1;
  const q = gridQuery(), holder = $("grid");
  if (!q) {
    [...holder.children].forEach(d => { Plotly.purge(d); d.remove(); });
    $("grid-note").textContent = (state.varying || []).length < 2
      ? "the grid needs two parameters that vary" : "pick two different parameters for x and y";
    return;
  }
  let g;
  try { g = await getJSON(apiBase() + "/grid?" + q); }
  catch (e) { if (seq === state.gridSeq) { $("grid-note").textContent = e.message; holder.replaceChildren(); } return; }
  if (seq !== state.gridSeq) return;
  state.grid = g;
  const shown = $("gm").value;
  const what = shown === "lockin" ? "lock-in rate (final acc >= " + g.lockin + ")"
    : shown === "escape_rate" ? "escape rate (acc >= " + g.escape_at + ")" : "median escape step (Kaplan-Meier)";
  $("grid-note").textContent = what + "; each cell: k/n and the " + g.ci + " interval; statuses " + g.statuses.join(", ") + ". Click a cell for its traces.";
  const wanted = g.panels.map((p, i) => "grid-" + i);
  [...holder.children].forEach(d => { if (!wanted.includes(d.id)) { Plotly.purge(d); d.remove(); } });
  const xs = g.x_values, ys = g.y_values;
  g.panels.forEach((p, i) => {
    let div = document.getElementById("grid-" + i);
    if (!div) {
      div = document.createElement("div"); div.id = "grid-" + i; div.className = "facet"; holder.appendChild(div);
      div.dataset.panel = String(i);
    }
    const z = ys.map(() => xs.map(() => null)), text = ys.map(() => xs.map(() => "")),
          custom = ys.map(() => xs.map(() => [0, 0, null, null, null]));
    p.cells.forEach(c => {
      const r = ys.indexOf(c.y), k = xs.indexOf(c.x);
      if (r < 0 || k < 0) return;
      z[r][k] = cellValue(c, shown);
      const head = shown === "escape_median" ? (c.median === null ? "-" : String(c.median)) : c.rate.toFixed(2);
      text[r][k] = head + "<br>" + c.k + "/" + c.n;
      custom[r][k] = [c.k, c.n, c.ci_low, c.ci_high, c.median];
    });
    const rate = shown === "escape_median" ? "" : "<br>rate %{z:.3f}";
    const hover = "x %{x}<br>y %{y}<br>k/n %{customdata[0]}/%{customdata[1]}" + rate +
      "<br>95% CI [%{customdata[2]:.3f}, %{customdata[3]:.3f}]" +
      (shown === "escape_median" ? "<br>median escape step %{customdata[4]}" : "") + "<extra></extra>";
    const trace = {
      type: "heatmap", x: xs.map(plotText), y: ys.map(plotText), z: z, text: text, customdata: custom,
      texttemplate: "%{text}", hovertemplate: hover, xgap: 2, ygap: 2, colorscale: "Viridis",
      zmin: shown === "escape_median" ? undefined : 0, zmax: shown === "escape_median" ? undefined : 1,
      colorbar: { title: { text: shown === "escape_median" ? "step" : "rate" } },
    };
    if (shown === "escape_median") trace.reversescale = true;
    Plotly.react(div, [trace], {
      title: { text: g.facet ? plotText(g.facet + " = " + p.value) : plotText(g.y + " × " + g.x), font: { size: 14 } },
      width: Math.max(440, Math.min(900, 180 + 90 * xs.length)), height: Math.max(280, 130 + 60 * ys.length),
      margin: { t: 40, r: 10, b: 60, l: 90 },
      xaxis: { title: { text: plotText(g.x) }, type: "category" }, yaxis: { title: { text: plotText(g.y) }, type: "category" },
    }, { displaylogo: false, displayModeBar: false });
    if (!div.__clickBound) {
      div.__clickBound = true;
      div.on("plotly_click", ev => {
        const pt = ev.points[0], gr = state.grid, pan = gr.panels[Number(div.dataset.panel)];
        const idx = pt.pointIndex || [pt.pointNumber[0], pt.pointNumber[1]];
        state.cell = { f: pan.value, y: gr.y_values[idx[0]], x: gr.x_values[idx[1]] };
        drawCell(); saveURL();
      });
    }
  });
  drawCell();
}

function findCell() {
  const g = state.grid, c = state.cell;
  if (!g || !c) return null;
  const p = g.panels.find(p => p.value === (g.facet ? c.f : null));
  return p ? p.cells.find(x => x.x === c.x && x.y === c.y) || null : null;
}

// The traces of the clicked cell's trials (the ids come from the server's grid, so the cell
// is the analysis's, whatever the values look like).
function drawCell() {
  const cell = findCell(), div = $("cell-traces");
  if (!cell) { $("cell-caption").textContent = ""; Plotly.purge(div); return; }
  const g = state.grid, ids = new Set(cell.trial_ids);
  if (state.paged && cell.trial_ids.some(id => !state.byId.has(id) && !state.absentIds.has(id))) {
    $("cell-caption").textContent = "fetching the cell's " + cell.trial_ids.length + " trials";
    const want = state.cell;
    ensureRows("ids", cell.trial_ids)
      .then(() => { if (state.cell === want) drawCell(); })
      .catch(e => { $("cell-caption").textContent = e.message; });
    return;
  }
  const mine = state.paged ? [...ids].map(id => state.byId.get(id)).filter(t => t).sort((a, b) => a.trial_id - b.trial_id)
    : state.trials.filter(t => ids.has(t.trial_id));
  if (state.big && mine.some(t => !own(state.traces, t.trial_id))) {
    $("cell-caption").textContent = "fetching the traces of the cell's " + mine.length + " trials";
    const want = state.cell;
    ensureTraces(mine.map(t => t.trial_id), MAX_POINTS)
      .then(() => { if (state.cell === want) drawCell(); })
      .catch(e => { $("cell-caption").textContent = e.message; });
    return;
  }
  const colour = $("group").value, groups = groupsOf(colour, mine);
  const gl = mine.length > GL_TRIALS && GL_PROBE && !(state.glFailed >= GL_RETRIES);
  const data = groupedTraces(mine, colour, groups, Number($("smooth").value) || 0, gl, "cell");
  const where = (g.facet ? g.facet + " = " + state.cell.f + ", " : "") + g.y + " = " + state.cell.y + ", " + g.x + " = " + state.cell.x;
  $("cell-caption").textContent = "cell " + where + ": " + cell.k + " of " + cell.n + " (rate " + cell.rate.toFixed(3) +
    ", 95% CI " + fmt(cell.ci_low) + " to " + fmt(cell.ci_high) + (cell.median !== null ? ", median escape step " + cell.median : "") + ")";
  Plotly.react(div, data, traceLayout(plotText("cell " + where), plotText(colour), null, 420), PLOT_CONFIG)
    .then(() => { if (div.querySelector(".no-webgl")) failedGL(div); });
}

// ---- the overlay: any trials ticked in the table, one line each --------------------------------
const MAX_OVERLAY = 50;
function toggleOverlay(key, box) {
  const i = state.overlay.indexOf(key);
  if (box.checked && i < 0) {
    if (state.overlay.length >= MAX_OVERLAY) {
      box.checked = false;
      $("overlay-error").textContent = "the overlay holds at most " + MAX_OVERLAY + " trials: untick one first";
      return;
    }
    state.overlay.push(key);
  } else if (!box.checked && i >= 0) state.overlay.splice(i, 1);
  $("overlay-error").textContent = "";
  drawOverlay(); saveURL();
}

function drawOverlay() {
  const div = $("overlay");
  if (state.paged && state.overlay.some(k => !state.byKey.has(k) && !state.absentKeys.has(k))) {
    ensureRows("keys", state.overlay).then(() => { if (state.paged) drawOverlay(); })
      .catch(e => { $("overlay-error").textContent = e.message; });
    return;
  }
  const byKey = state.paged ? state.byKey : new Map(state.trials.map(t => [t.key, t]));
  const shown = state.overlay.filter(k => byKey.has(k)), missing = state.overlay.filter(k => !byKey.has(k));
  $("noverlay").textContent = "(" + shown.length + " of at most " + MAX_OVERLAY + ")";
  $("overlay-note").textContent = (shown.length ? "the ticked trials' traces, one colour each"
    : "tick trials in the table to draw their traces on one chart (at most " + MAX_OVERLAY + ")") +
    (missing.length ? "; not among this view's trials: " + missing.join(", ") : "");
  if (!shown.length) { Plotly.purge(div); div.dataset.keys = ""; return; }
  const lacking = shown.map(k => byKey.get(k).trial_id).filter(id => !own(state.traces, id));
  if (state.big && lacking.length) {
    ensureTraces(lacking).then(drawOverlay).catch(e => { $("overlay-error").textContent = e.message; });
    return;
  }
  const smooth = Number($("smooth").value) || 0, data = [], loss = [];
  shown.forEach((k, i) => {
    const t = byKey.get(k), tr = state.traces[t.trial_id] || { step: [], acc: [], loss: [] };
    const color = PALETTE[i % PALETTE.length], name = plotText(k);
    const dash = ["solid", "dash", "dot", "dashdot"][Math.floor(i / PALETTE.length) % 4];
    const common = { type: "scatter", mode: "lines", x: tr.step, name: name, legendgroup: "o" + i,
                     line: { color: color, width: 1.5, dash: dash } };
    data.push(Object.assign({}, common, { uid: "ov-acc-" + i, y: ema(tr.acc, smooth), yaxis: "y", xaxis: "x",
      hovertemplate: name + "<br>step %{x}: acc %{y:.3f}<extra></extra>" }));
    loss.push(Object.assign({}, common, { uid: "ov-loss-" + i, y: ema(tr.loss, smooth), yaxis: "y2", xaxis: "x2", showlegend: false,
      hovertemplate: name + "<br>step %{x}: loss %{y:.3f}<extra></extra>" }));
  });
  div.dataset.keys = shown.join(",");
  Plotly.react(div, data.concat(loss), traceLayout("overlay: " + shown.length + " trial(s)" + (smooth ? " (EMA " + smooth + ")" : ""), "trial", null, 480), PLOT_CONFIG);
}

// ---- parallel coordinates -----------------------------------------------------------------------
// Drawn as ordinary SVG lines over normalised axes (Plotly's parcoords needs WebGL, which a
// headless or software-rendered browser often lacks): one polyline per trial through its
// swept parameters and, last, the outcome it is coloured by. Categorical axes (and numbers
// with a dozen levels or fewer) space their levels evenly; clicking a level keeps only the
// trials with it (several levels, several axes: and across axes, or within one).
const PC_LEVELS = 12, PC_BINS = 10;
// Lines drawn at most: past it every k-th trial's (the axes, the levels and the counts still
// from every trial). 100,000 SVG polylines held a 100,000-trial page's browser ~10 s.
const PC_LINES = 2000;
const PC_OUTCOMES = { final_acc: "final accuracy", lockin: "lock-in", escape_step: "escape step" };
const VIRIDIS = ["#440154", "#482878", "#3e4a89", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];

async function drawPC() {
  const seq = state.pcSeq = (state.pcSeq || 0) + 1;
  const q = new URLSearchParams(); if (state.where) q.set("where", state.where);
  let o;
  try { o = await getJSON(apiBase() + "/outcomes?" + q); }
  catch (e) { if (seq === state.pcSeq) { $("pc-note").textContent = e.message; Plotly.purge($("parcoords")); } return; }
  if (seq !== state.pcSeq) return;
  state.pc = o;
  fillPCAxes(o.axes);
  renderPC();
}

function fillPCAxes(axes) {
  const holder = $("pc-axes");
  if (holder.dataset.axes === JSON.stringify(axes)) return;
  holder.dataset.axes = JSON.stringify(axes);
  holder.replaceChildren(el("span", "axes: "));
  axes.forEach(a => {
    const box = document.createElement("input");
    box.type = "checkbox"; box.className = "pc-axis"; box.value = a;
    box.checked = !state.pcAxes || state.pcAxes.includes(a);
    box.onchange = () => {
      const on = [...holder.querySelectorAll("input.pc-axis")].filter(b => b.checked).map(b => b.value);
      state.pcAxes = on.length === axes.length ? null : on;
      renderPC(); saveURL();
    };
    const lab = document.createElement("label"); lab.append(box, " " + a); holder.append(lab, " ");
  });
}

function pcAxis(name, values) {
  const labs = values.map(label), uniq = [...new Set(labs)];
  const nums = values.every(v => typeof v === "number" && isFinite(v));
  if (nums && uniq.length > PC_LEVELS) {
    const lo = Math.min(...values), hi = Math.max(...values), log = lo > 0 && hi / lo >= 100;
    const f = v => log ? Math.log10(v) : v, a = f(lo), b = f(hi), span = b - a || 1;
    const ticks = [0, 0.25, 0.5, 0.75, 1].map(u => { const x = a + u * span; return { y: u, text: fmt(log ? Math.pow(10, x) : x) }; });
    return { name: name, cat: false, pos: v => (f(v) - a) / span, ticks: ticks };
  }
  const levels = uniq.sort((x, y) => nums ? Number(x) - Number(y) : x.localeCompare(y));
  const at = new Map(levels.map((l, i) => [l, levels.length > 1 ? i / (levels.length - 1) : 0.5]));
  return { name: name, cat: true, pos: v => at.get(label(v)), ticks: levels.map(l => ({ y: at.get(l), text: l })) };
}

// A small, fixed offset per trial on categorical axes, so that trials sharing every level
// are told apart and their number shows.
function jitter(i) { return (((i * 2654435761) >>> 0) % 1000 / 1000 - 0.5) * 0.03; }

function renderPC() {
  const o = state.pc, div = $("parcoords");
  if (!o) return;
  const outcome = $("pc-outcome").value, what = PC_OUTCOMES[outcome];
  const names = o.axes.filter(a => !state.pcAxes || state.pcAxes.includes(a));
  const rows = o.rows.filter(r => r[outcome] !== null && r[outcome] !== undefined);
  div.dataset.outcome = outcome;
  if (!rows.length || !names.length) {
    Plotly.purge(div);
    $("pc-note").textContent = !o.axes.length ? "no parameter varies in this sweep" : !names.length ? "tick at least one axis" : "no trial has a " + what + " yet";
    return;
  }
  const axes = names.map(n => pcAxis(n, rows.map(r => own(r.params, n) ? r.params[n] : null)));
  const ov = rows.map(r => r[outcome]);
  const out = outcome === "final_acc" ? { name: what, cat: false, pos: v => v, ticks: [0, 0.25, 0.5, 0.75, 1].map(u => ({ y: u, text: String(u) })) }
    : outcome === "lockin" ? { name: what, cat: true, pos: v => v, ticks: [{ y: 0, text: "no (0)" }, { y: 1, text: "yes (1)" }] }
    : pcAxis(what, ov);
  if (outcome === "final_acc") { out.pos = v => Math.max(0, Math.min(1, v)); }
  axes.push(out);
  // (a loop, not Math.min(...ov): a spread of 100,000 arguments can pass the engine's limit)
  const lo = outcome === "final_acc" ? 0 : ov.reduce((a, b) => a < b ? a : b), hi = outcome === "final_acc" ? 1 : ov.reduce((a, b) => a > b ? a : b);
  const stride = Math.ceil(rows.length / PC_LINES);
  const kept = r => Object.entries(state.pcSel).every(([a, ls]) => !names.includes(a) || !ls.length || ls.includes(label(own(r.params, a) ? r.params[a] : null)));
  const bins = VIRIDIS.map(() => ({ x: [], y: [], text: [] })), grey = { x: [], y: [], text: [] };
  let nKept = 0;
  rows.forEach((r, i) => {
    const ok = kept(r); if (ok) nKept++;
    if (i % stride) return;
    const c = hi > lo ? (r[outcome] - lo) / (hi - lo) : 0.5;
    const bin = ok ? bins[Math.min(PC_BINS - 1, Math.floor(c * PC_BINS))] : grey;
    if (bin.x.length) { bin.x.push(null); bin.y.push(null); bin.text.push(""); }
    const who = plotText(r.key) + "<br>" + plotText(what) + " " + fmt(r[outcome]);
    axes.forEach((ax, j) => {
      const v = j < names.length ? (own(r.params, names[j]) ? r.params[names[j]] : null) : r[outcome];
      bin.x.push(j); bin.y.push(ax.pos(v) + (ax.cat ? jitter(i + 7 * j) : 0)); bin.text.push(who);
    });
  });
  const line = (b, color, uid) => ({ type: "scatter", mode: "lines", uid: uid, x: b.x, y: b.y, text: b.text, connectgaps: false,
    line: { color: color, width: 1.3 }, opacity: color === "#cccccc" ? 0.6 : 0.85, hovertemplate: "%{text}<extra></extra>", showlegend: false });
  const data = [line(grey, "#cccccc", "pc-grey")].concat(bins.map((b, i) => line(b, VIRIDIS[i], "pc-" + i)));
  // The levels: clickable markers (filled where the filter keeps them), and the outcome's
  // points with the colour bar.
  const lx = [], ly = [], lc = [], lfill = [];
  axes.slice(0, names.length).forEach((ax, j) => {
    if (!ax.cat) return;
    ax.ticks.forEach(t => { lx.push(j); ly.push(t.y); lc.push([ax.name, t.text]); lfill.push((state.pcSel[ax.name] || []).includes(t.text) ? "#222" : "#fff"); });
  });
  data.push({ type: "scatter", mode: "markers", uid: "pc-levels", x: lx, y: ly, customdata: lc, showlegend: false,
    marker: { size: 11, color: lfill, line: { color: "#222", width: 1.5 } }, hovertemplate: "click to keep only these trials<extra></extra>" });
  const drawn = stride > 1 ? rows.filter((_r, i) => i % stride === 0) : rows;
  data.push({ type: "scatter", mode: "markers", uid: "pc-outcome", x: drawn.map(() => names.length), y: drawn.map(r => out.pos(r[outcome])),
    showlegend: false, hoverinfo: "skip", marker: { size: 6, color: drawn.map(r => r[outcome]), cmin: lo, cmax: hi, colorscale: "Viridis",
    showscale: true, colorbar: { title: { text: plotText(what) } } } });
  const ann = [], shapes = [];
  axes.forEach((ax, j) => {
    shapes.push({ type: "line", x0: j, x1: j, y0: 0, y1: 1, line: { color: "#888", width: 1 } });
    ann.push({ x: j, y: 1.08, text: plotText(ax.name), showarrow: false, font: { size: 12 } });
    ax.ticks.forEach(t => ann.push({ x: j, y: t.y, text: plotText(t.text), showarrow: false, xanchor: "right", xshift: -10, font: { size: 10, color: "#444" } }));
  });
  Plotly.react(div, data, {
    height: 440, margin: { t: 40, r: 20, b: 20, l: 30 }, annotations: ann, shapes: shapes, hovermode: "closest",
    xaxis: { range: [-0.6, axes.length - 0.5], showgrid: false, zeroline: false, showticklabels: false, fixedrange: true },
    yaxis: { range: [-0.06, 1.14], showgrid: false, zeroline: false, showticklabels: false, fixedrange: true },
  }, { displaylogo: false, responsive: true });
  if (!div.__pcBound) {
    div.__pcBound = true;
    div.on("plotly_click", ev => {
      const pt = ev.points.find(p => p.data.uid === "pc-levels");
      if (!pt) return;
      const [a, lev] = pt.customdata, cur = state.pcSel[a] || [];
      state.pcSel[a] = cur.includes(lev) ? cur.filter(x => x !== lev) : cur.concat([lev]);
      if (!state.pcSel[a].length) delete state.pcSel[a];
      renderPC(); saveURL();
    });
  }
  const filt = Object.entries(state.pcSel).filter(([a]) => names.includes(a)).map(([a, ls]) => a + " in {" + ls.join(", ") + "}");
  const sample = stride > 1 ? " (" + drawn.length + " of its " + rows.length + " lines drawn: one trial in " + stride + ")" : "";
  $("pc-note").textContent = "one line per trial the analysis counts (statuses " + o.statuses.join(", ") + ")" + sample + ", coloured by " + what +
    (outcome === "lockin" ? " (final acc >= " + o.lockin + ")" : outcome === "escape_step" ? " (acc >= " + o.escape_at + "; a trial that never escaped at its last eval)" : "") +
    "; categorical levels spread a little so that coinciding trials show" +
    (filt.length ? "; kept: " + filt.join(" and ") + " (" + nKept + " of " + rows.length + ", the rest grey)" : "; click a level to keep only its trials");
}

// ---- parameter importance ----------------------------------------------------------------------
async function drawImportance() {
  const seq = state.impSeq = (state.impSeq || 0) + 1, div = $("importance");
  const q = new URLSearchParams({ outcome: $("pc-outcome").value }); if (state.where) q.set("where", state.where);
  let r;
  try { r = await getJSON(apiBase() + "/importance?" + q); }
  catch (e) { if (seq === state.impSeq) { $("imp-note").textContent = e.message; Plotly.purge(div); } return; }
  if (seq !== state.impSeq) return;
  const head = "importance of each swept parameter for the " + r.outcome_label + ": " + r.method + ", " + r.n_trials +
    " trials (statuses " + r.statuses.join(", ") + ")" + (r.dropped ? ", " + r.dropped + " without a known one left out" + (r.stopped ? " (" + r.stopped + " ended by the stop rule: their state at the budget is unknown)" : "") : "");
  $("imp-note").textContent = head + (r.note ? ": " + r.note : "; the importances sum to 1");
  div.dataset.method = r.method;
  if (!r.params.length) { Plotly.purge(div); return; }
  const ps = r.params.slice().reverse();
  Plotly.react(div, [{ type: "bar", orientation: "h", x: ps.map(p => p.importance), y: ps.map(p => plotText(p.param + " (" + p.kind + ")")),
    text: ps.map(p => p.importance.toFixed(3)), textposition: "auto", marker: { color: "#1f77b4" },
    hovertemplate: "%{y}: %{x:.4f}<extra></extra>" }], {
    height: Math.max(200, 90 + 36 * ps.length), margin: { t: 30, r: 20, b: 40, l: 200 },
    title: { text: plotText(r.method + ": " + r.outcome_label), font: { size: 13 } },
    xaxis: { title: { text: "importance (sums to 1)" }, range: [0, 1] }, yaxis: { type: "category" },
  }, { displaylogo: false, responsive: true });
}

// Colour-by lists the parameters that vary first, then the rest; facet-by and the grid's axes
// the varying ones. The URL's picks win where the sweep has them.
function fillControls(t) {
  const g = $("group"), f = $("facet");
  if (g.options.length) return;
  const rest = t.params.filter(p => !t.varying.includes(p));
  t.varying.concat(rest).forEach(p => g.add(new Option(p, p)));
  t.varying.forEach(p => { f.add(new Option(p, p)); $("gx").add(new Option(p, p)); $("gy").add(new Option(p, p)); $("gf").add(new Option(p, p)); });
  // Colour by default by the varying parameter with the fewest values (a handful of groups
  // reads; seed with hundreds does not, and costs a trace per group): the server's count
  // for a paged view, which holds a page of the trials.
  const counts = t.paged ? [] : t.varying.filter(p => p !== "seed").map(p => [groupsOf(p, t.trials).length, p]).sort((a, b) => a[0] - b[0]);
  if (counts.length) g.value = counts[0][1];
  else if (t.paged && t.default_by) choose(g, t.default_by);
  choose(g, INITIAL.get("color")); choose(f, INITIAL.get("facet"));
  // Default grid: lr across when it varies, the first other varying non-seed parameter down.
  const axes = t.varying.filter(p => p !== "seed");
  const x0 = axes.includes("lr") ? "lr" : axes[0] || t.varying[0];
  const y0 = axes.find(p => p !== x0) || t.varying.find(p => p !== x0);  // seed when nothing else varies
  if (x0) $("gx").value = x0;
  if (y0) $("gy").value = y0;
  choose($("gx"), INITIAL.get("gx")); choose($("gy"), INITIAL.get("gy")); choose($("gf"), INITIAL.get("gf"));
}

async function reload() {
  const w = $("where").value.trim();
  const q = new URLSearchParams(); if (w) q.set("where", w);
  try {
    const qt = new URLSearchParams(q); qt.set("max_points", String(MAX_POINTS));
    // Bands or every trace: a guess from the last view's trial count (the shell's count on
    // the first load) so both requests go at once; a wrong guess costs one more request.
    const traces = () => getJSON(apiBase() + "/traces?" + qt);
    // A link's colour this sweep lacks is a 400 here: drawBands then asks with the one picked.
    const bands = by => getJSON(apiBase() + "/bands?" + bandQuery(w, by, null)).catch(() => null);
    const count = state.loaded ? state.total : Number(PAGE.trials) || 0, guess = count > BAND_TRIALS;
    const [t, first] = await Promise.all([fetchTrials(w, state.loaded ? state.paged : count > PAGED_TRIALS),
      guess ? bands($("group").value || INITIAL.get("color")) : traces()]);
    const big = (t.paged ? t.total : t.trials.length) > BAND_TRIALS;
    const tr = big === guess ? first : await (big ? bands($("group").value || INITIAL.get("color")) : traces());
    state.where = w; state.loaded = true; state.big = big;
    forgetRows(); takeTrials(t); state.traces = {}; state.cursor = null;
    fillControls(t);
    if (big) { state.bands = tr; state.bandsWhere = w; state.stride = 1; state.bandAt = Date.now(); }
    else { state.bands = null; state.stride = tr.stride; mergeTraces(state.traces, tr); state.cursor = tr.cursor; }
    showError("");
  } catch (e) { showError(e.message); return; }
  // One view at a time, the grid first: each costs the server an analysis pass of the sweep
  // (the parallel coordinates reuse the grid's, fANOVA is the costliest), and on a big sweep
  // they would all share its CPU. The escape-time curves make their own pass only while a
  // trial runs; with none running they share the grid's (ui.db._prepared, built once for
  // both requests), so they are asked for with it. The grid's request goes before the table
  // and traces are drawn: the server computes it while the browser draws.
  // A paged view counts from the shell (its count at load); a whole table from its rows.
  const running = state.paged ? Number(PAGE.running) || 0 : state.trials.filter(t => t.status === "running").length;
  const grid = drawGrid(), km = running ? null : drawKM();
  drawTable(); drawTraces(); drawOverlay(); saveURL();
  grid.finally(() => { drawPC(); (km || drawKM()).finally(drawImportance); });
}

// A big sweep's page: new bands (and trials) once the sweep's write stamp moves, looked at
// every 10 s (a moving sweep's bands are recomputed on each look).
async function pollBands() {
  if (Date.now() - (state.bandAt || 0) < 10000) return;
  state.bandAt = Date.now();
  const b = await getJSON(apiBase() + "/bands?" + bandQuery(state.where, $("group").value, $("facet").value || null));
  if (!state.big || (state.bands && b.stamp === state.bands.stamp)) { $("live").textContent = "live: unchanged at " + new Date().toISOString().slice(11, 19); return; }
  // The whole table again, or the page on screen (a paged view).
  const t = await fetchTrials(state.where, state.paged);
  state.absentIds.clear(); state.absentKeys.clear();
  takeTrials(t); state.bands = b; state.bandsWhere = state.where; state.traces = {};
  drawTraces(); drawTable(); drawCell(); drawOverlay(); state.kmDirty = true;
  if (Date.now() - state.kmAt > 10000) { state.kmDirty = false; drawKM(); drawGrid(); drawPC(); drawImportance(); }
  $("live").textContent = "live: new rows by " + new Date().toISOString().slice(11, 19);
}

async function poll() {
  if (state.busy || (state.cursor === null && !state.big)) return;
  state.busy = true;
  if (state.big) {
    try { await pollBands(); } catch (e) { $("live").textContent = "live: " + e.message; } finally { state.busy = false; }
    return;
  }
  try {
    const tr = await postJSON(apiBase() + "/traces", { since: state.cursor, where: state.where || null });
    state.cursor = tr.cursor;
    const anyRunning = state.trials.some(t => t.status === "running" || t.status === "pending");
    if (tr.n > 0 || anyRunning) {
      mergeTraces(state.traces, tr);
      takeTrials(await fetchTrials(state.where, state.paged));
      if (tr.n > 0) { drawTraces(); drawOverlay(); state.kmDirty = true; }
      drawTable();
    }
    // The escape-time view and the grid cost a full analysis pass: redraw them at most every
    // 10 s, but always once after the last new rows.
    if (state.kmDirty && Date.now() - state.kmAt > 10000) { state.kmDirty = false; drawKM(); drawGrid(); drawPC(); drawImportance(); }
    $("live").textContent = "live: " + tr.n + " new rows at " + tr.now;
  } catch (e) { $("live").textContent = "live: " + e.message; }
  finally { state.busy = false; }
}

// The forms never submit (the CSP's form-action 'none' would refuse it anyway): apply and
// Enter reload in place.
$("controls").addEventListener("submit", e => e.preventDefault());
$("grid-controls").addEventListener("submit", e => e.preventDefault());
$("apply").onclick = reload;
$("where").addEventListener("keydown", e => { if (e.key === "Enter") reload(); });
$("group").onchange = () => { drawTraces(); drawCell(); drawKM(); saveURL(); };
$("facet").onchange = () => { drawTraces(); saveURL(); };
["xscale", "accscale", "lossscale"].forEach(id => { $(id).onchange = () => { drawTraces(); drawCell(); drawKM(); saveURL(); }; });
$("smooth").oninput = () => { $("smooth-value").textContent = $("smooth").value; drawTraces(); drawCell(); saveURL(); };
["gx", "gy", "gf", "gm"].forEach(id => { $(id).onchange = () => { state.cell = null; drawGrid(); saveURL(); }; });
$("pc-controls").addEventListener("submit", e => e.preventDefault());
$("pc-outcome").onchange = () => { renderPC(); drawImportance(); saveURL(); };
$("pc-clear").onclick = () => { state.pcSel = {}; renderPC(); saveURL(); };
$("overlay-clear").onclick = () => { state.overlay = []; $("overlay-error").textContent = ""; drawTable(); drawOverlay(); saveURL(); };
$("prev").onclick = () => { state.page = Math.max(0, state.page - 1); if (state.paged) loadPage(); else { drawTable(); saveURL(); } };
$("next").onclick = () => { state.page++; if (state.paged) loadPage(); else { drawTable(); saveURL(); } };
restoreScalars();
reload();
setInterval(poll, POLL_MS);
