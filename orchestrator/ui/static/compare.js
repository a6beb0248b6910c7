// Two sweeps overlaid along a parameter both have: per value, each sweep's lock-in or escape
// rate with its 95% interval (or the median escape step), from /api/compare, one series per
// sweep and arm (or the parameter picked under "series per"). Categories (arms, tasks, cells)
// are points with whiskers, side by side, never joined by a line; numbers may be. The picks
// and the where filter live in the query string, so a link reproduces the view.
const $ = id => document.getElementById(id);
const INITIAL = urlState();

function query() {
  const q = new URLSearchParams({ a: $("a").value, b: $("b").value });
  if ($("by").value) q.set("by", $("by").value);
  if ($("split").value) q.set("split", $("split").value);
  if ($("where").value.trim()) q.set("where", $("where").value.trim());
  q.set("metric", $("metric").value === "lockin" ? "lockin" : "escape_median");
  return q;
}

function save() {
  writeURL({ a: $("a").value, b: $("b").value, by: $("by").value, split: $("split").value, where: $("where").value.trim(),
             metric: $("metric").value === "lockin" ? "" : $("metric").value, xscale: $("xscale").value === "log" ? "log" : "" });
  $("csv").href = "/api/compare/csv?" + query();
}

async function draw() {
  const seq = draw.seq = (draw.seq || 0) + 1;
  let c;
  try { c = await getJSON("/api/compare?" + query()); }
  catch (e) { if (seq === draw.seq) { $("error").textContent = e.message; $("views").classList.add("stale"); } return; }
  if (seq !== draw.seq) return;
  $("error").textContent = ""; $("views").classList.remove("stale");
  const by = $("by");
  if (by.options.length === 0 || [...by.options].map(o => o.value).join("\n") !== c.shared.join("\n")) {
    by.replaceChildren(...c.shared.map(p => new Option(p, p)));
  }
  by.value = c.by;
  const split = $("split"), want = ["", "none"].concat(c.shared.filter(p => p !== c.by));
  if ([...split.options].map(o => o.value).join("\n") !== want.join("\n")) {
    const cur = split.value;
    split.replaceChildren(new Option("(arm where it varies)", ""), new Option("(none: pooled)", "none"),
      ...c.shared.filter(p => p !== c.by).map(p => new Option(p, p)));
    choose(split, cur);
  }
  const shown = $("metric").value, rated = shown !== "escape_median";
  const values = [...new Set(c.a_cells.concat(c.b_cells).map(r => r.value))];
  const numeric = values.every(v => v !== "" && !isNaN(Number(v)));
  if (numeric) values.sort((x, y) => Number(x) - Number(y));
  // One series per sweep and split value, in a fixed order.
  const series = [];
  ["a", "b"].forEach(s => {
    const parts = new Map();
    c[s + "_cells"].forEach(r => { const k = r.split === null ? "" : String(r.split); if (!parts.has(k)) parts.set(k, []); parts.get(k).push(r); });
    parts.forEach((rows, k) => series.push({ side: s, split: k, rows: rows,
      name: c[s] + (c.split ? " / " + c.split + " = " + k : "") + (c.a === c.b ? " (" + s + ")" : "") }));
  });
  const symbols = ["circle", "square", "diamond", "triangle-up", "x", "cross", "star", "triangle-down"];
  const width = 0.6, step = series.length > 1 ? width / (series.length - 1) : 0;
  const data = series.map((se, i) => {
    const rows = se.rows, y = rows.map(r => rated ? r.rate : r.median);
    // Categories: each series at its own offset within the category's slot, so series that
    // coincide stay apart. Numbers: the true x, with a marker shape and size per series.
    const x = numeric ? rows.map(r => Number(r.value)) : rows.map(r => values.indexOf(r.value) - width / 2 + i * step);
    const t = { type: "scatter", mode: numeric ? "lines+markers" : "markers", name: plotText(se.name),
                line: { color: PALETTE[i % PALETTE.length], dash: ["solid", "dash", "dot", "dashdot"][i % 4] },
                marker: { symbol: symbols[i % symbols.length], size: numeric ? 12 - 2 * (i % 4) : 9, color: PALETTE[i % PALETTE.length] },
                x: x, y: y, customdata: rows.map(r => [r.k, r.n, plotText(r.value)]),
                hovertemplate: plotText(se.name) + "<br>" + plotText(c.by) + " %{customdata[2]}: %{y:.3f} (k/n %{customdata[0]}/%{customdata[1]})<extra></extra>" };
    if (rated) {
      t.error_y = { type: "data", symmetric: false, width: 6, array: rows.map(r => r.ci_high - r.rate), arrayminus: rows.map(r => r.rate - r.ci_low) };
    }
    return t;
  });
  const what = shown === "lockin" ? "lock-in rate" : shown === "escape_rate" ? "escape rate" : "median escape step (Kaplan-Meier)";
  const xaxis = numeric ? { title: { text: plotText(c.by) }, type: $("xscale").value }
    : { title: { text: plotText(c.by) }, tickmode: "array", tickvals: values.map((v, i) => i), ticktext: values.map(plotText),
        range: [-0.6, values.length - 0.4], zeroline: false };
  Plotly.react($("compare"), data, {
    height: 420, margin: { t: 30, r: 10, b: 50, l: 60 }, xaxis: xaxis, showlegend: true,
    yaxis: rated ? { title: { text: what }, range: [0, 1.02] } : { title: { text: what } },
  }, { displaylogo: false });
  $("compare").dataset.mode = numeric ? "lines" : "points";
  const per = c.split ? "one series per sweep and " + c.split : "one series per sweep (pooled over every other parameter)";
  const drawn = numeric ? "lines through the values of " + c.by : "points per " + c.by + " value, side by side, not joined";
  $("note").textContent = what + " per " + c.by + ", " + per + "; " + drawn + "; " +
    (rated ? "whiskers: the " + c.ci + " interval." : "no interval drawn (the table lists each rate's).") +
    (c.where ? " Only trials where " + c.where + "." : "");
  $("by-head").textContent = c.by;
  $("split-head").textContent = c.split || "";
  const body = $("cells").tBodies[0];
  body.replaceChildren(...["a", "b"].flatMap(s => c[s + "_cells"].map(r => {
    const tr = document.createElement("tr");
    [c[s], r.split === null ? "" : r.split, r.value, r.k, r.n, fmt(r.rate), "[" + fmt(r.ci_low) + ", " + fmt(r.ci_high) + "]", r.median === null ? "" : r.median]
      .forEach(v => tr.appendChild(el("td", v)));
    return tr;
  })));
  save();
}

async function start() {
  const sweeps = (await getJSON("/api/sweeps")).sweeps.map(s => s.name);
  ["a", "b"].forEach((id, i) => {
    $(id).replaceChildren(...sweeps.map(n => new Option(n, n)));
    $(id).value = sweeps[Math.min(i, sweeps.length - 1)] || "";
    choose($(id), INITIAL.get(id));
  });
  choose($("metric"), INITIAL.get("metric")); choose($("xscale"), INITIAL.get("xscale"));
  $("where").value = INITIAL.get("where") || "";
  const split = INITIAL.get("split");
  if (split && split !== "none") $("split").add(new Option(split, split));
  choose($("split"), split);
  const by = INITIAL.get("by");
  if (by) $("by").add(new Option(by, by));
  draw();
}

$("controls").addEventListener("submit", e => e.preventDefault());
["a", "b"].forEach(id => { $(id).onchange = () => { $("by").replaceChildren(); draw(); }; });
["by", "metric", "xscale", "split"].forEach(id => { $(id).onchange = draw; });
$("apply").onclick = draw;
$("by").onchange = () => { if ($("split").value === $("by").value) $("split").value = ""; draw(); };
$("where").addEventListener("keydown", e => { if (e.key === "Enter") { e.preventDefault(); draw(); } });
start();
