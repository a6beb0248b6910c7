// The sweep page: accuracy and loss traces coloured by a chosen parameter, faceted by another,
// filtered by a --where condition, smoothed and on linear or log axes; the grid of lock-in or
// escape per cell (click a cell for its traces); Kaplan-Meier curves; the paged trial table.
// New eval rows arrive through the incremental traces endpoint and are appended in place.
// Everything the user picks is in the query string (writeURL), so a link reproduces the view.
const state = { trials: [], traces: {}, cursor: null, where: "", sort: ["key", 1], page: 0,
                kmAt: 0, kmDirty: false, busy: false, grid: null, cell: null, gridAt: 0 };
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

// Own properties only: a parameter named "constructor" is a parameter, not Object's.
const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
function param(t, name) { return name && own(t.params, name) ? t.params[name] : null; }
function label(v) { return v === null || v === undefined ? "(none)" : typeof v === "object" ? JSON.stringify(v) : String(v); }

function groupsOf(name, trials) {
  const seen = new Set();
  for (const t of trials || state.trials) seen.add(label(param(t, name)));
  const all = [...seen];
  const nums = all.every(g => g !== "" && !isNaN(Number(g)));
  return all.sort((a, b) => nums ? Number(a) - Number(b) : a.localeCompare(b));
}

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
  const varying = state.varying || [];
  const cols = ["key"].concat(varying, ["status", "step", "final_acc", "best_acc", "error"]);
  const hr = document.createElement("tr");
  cols.forEach(c => {
    const th = el("th", c + (state.sort[0] === c ? (state.sort[1] > 0 ? " ▲" : " ▼") : ""));
    th.dataset.col = c;
    th.onclick = () => { state.sort = [c, state.sort[0] === c ? -state.sort[1] : 1]; state.page = 0; drawTable(); saveURL(); };
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
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  state.page = Math.min(state.page, pages - 1);
  const shown = rows.slice(state.page * PAGE_ROWS, (state.page + 1) * PAGE_ROWS);
  const body = $("trials").tBodies[0];
  body.replaceChildren();
  for (const t of shown) {
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
  $("page").textContent = "page " + (state.page + 1) + " of " + pages;
  $("prev").disabled = state.page === 0; $("next").disabled = state.page >= pages - 1;
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
  const mine = state.trials.filter(t => ids.has(t.trial_id));
  const colour = $("group").value, groups = groupsOf(colour, mine);
  const gl = mine.length > GL_TRIALS && GL_PROBE && !(state.glFailed >= GL_RETRIES);
  const data = groupedTraces(mine, colour, groups, Number($("smooth").value) || 0, gl, "cell");
  const where = (g.facet ? g.facet + " = " + state.cell.f + ", " : "") + g.y + " = " + state.cell.y + ", " + g.x + " = " + state.cell.x;
  $("cell-caption").textContent = "cell " + where + ": " + cell.k + " of " + cell.n + " (rate " + cell.rate.toFixed(3) +
    ", 95% CI " + fmt(cell.ci_low) + " to " + fmt(cell.ci_high) + (cell.median !== null ? ", median escape step " + cell.median : "") + ")";
  Plotly.react(div, data, traceLayout(plotText("cell " + where), plotText(colour), null, 420), PLOT_CONFIG)
    .then(() => { if (div.querySelector(".no-webgl")) failedGL(div); });
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
  // reads; seed with hundreds does not, and costs a trace per group).
  const counts = t.varying.filter(p => p !== "seed").map(p => [groupsOf(p, t.trials).length, p]).sort((a, b) => a[0] - b[0]);
  if (counts.length) g.value = counts[0][1];
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
    const [t, tr] = await Promise.all([getJSON(apiBase() + "/trials?" + q), getJSON(apiBase() + "/traces?" + qt)]);
    state.stride = tr.stride;
    state.where = w;
    state.trials = t.trials; state.varying = t.varying; state.traces = {}; state.cursor = null;
    fillControls(t);
    mergeTraces(state.traces, tr); state.cursor = tr.cursor;
    showError("");
  } catch (e) { showError(e.message); return; }
  drawTable(); drawTraces(); drawGrid(); drawKM(); saveURL();
}

async function poll() {
  if (state.busy || state.cursor === null) return;
  state.busy = true;
  try {
    const tr = await postJSON(apiBase() + "/traces", { since: state.cursor, where: state.where || null });
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
    // The escape-time view and the grid cost a full analysis pass: redraw them at most every
    // 10 s, but always once after the last new rows.
    if (state.kmDirty && Date.now() - state.kmAt > 10000) { state.kmDirty = false; drawKM(); drawGrid(); }
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
$("prev").onclick = () => { state.page = Math.max(0, state.page - 1); drawTable(); saveURL(); };
$("next").onclick = () => { state.page++; drawTable(); saveURL(); };
restoreScalars();
reload();
setInterval(poll, POLL_MS);
