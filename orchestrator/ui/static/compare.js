// Two sweeps overlaid along a parameter both have: per value, each sweep's lock-in or escape
// rate with its 95% interval (or the median escape step), from /api/compare. The picks live
// in the query string, so a link reproduces the view.
const $ = id => document.getElementById(id);
const INITIAL = urlState();

function query() {
  const q = new URLSearchParams({ a: $("a").value, b: $("b").value });
  if ($("by").value) q.set("by", $("by").value);
  q.set("metric", $("metric").value === "lockin" ? "lockin" : "escape_median");
  return q;
}

function save() {
  writeURL({ a: $("a").value, b: $("b").value, by: $("by").value,
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
  const shown = $("metric").value;
  const values = [...new Set(c.a_cells.concat(c.b_cells).map(r => r.value))];
  const numeric = values.every(v => v !== "" && !isNaN(Number(v)));
  const data = ["a", "b"].map((s, i) => {
    const rows = c[s + "_cells"];
    const y = rows.map(r => shown === "escape_median" ? r.median : r.rate);
    const t = { type: "scatter", mode: "lines+markers", name: plotText(c[s]), line: { color: PALETTE[i] },
                x: rows.map(r => numeric ? Number(r.value) : plotText(r.value)), y: y,
                customdata: rows.map(r => [r.k, r.n]),
                hovertemplate: plotText(c[s]) + "<br>%{x}: %{y:.3f} (k/n %{customdata[0]}/%{customdata[1]})<extra></extra>" };
    if (shown !== "escape_median") {
      t.error_y = { type: "data", symmetric: false, array: rows.map(r => r.ci_high - r.rate), arrayminus: rows.map(r => r.rate - r.ci_low) };
    }
    return t;
  });
  const what = shown === "lockin" ? "lock-in rate" : shown === "escape_rate" ? "escape rate" : "median escape step";
  Plotly.react($("compare"), data, {
    height: 420, margin: { t: 30, r: 10, b: 50, l: 60 },
    xaxis: { title: { text: plotText(c.by) }, type: numeric ? $("xscale").value : "category" },
    yaxis: shown === "escape_median" ? { title: { text: what } } : { title: { text: what }, range: [0, 1.02] },
  }, { displaylogo: false });
  $("note").textContent = what + " per " + c.by + "; bars: the " + c.ci + " interval.";
  $("by-head").textContent = c.by;
  const body = $("cells").tBodies[0];
  body.replaceChildren(...["a", "b"].flatMap(s => c[s + "_cells"].map(r => {
    const tr = document.createElement("tr");
    [c[s], r.value, r.k, r.n, fmt(r.rate), "[" + fmt(r.ci_low) + ", " + fmt(r.ci_high) + "]", r.median === null ? "" : r.median]
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
  const by = INITIAL.get("by");
  if (by) $("by").add(new Option(by, by));
  draw();
}

$("controls").addEventListener("submit", e => e.preventDefault());
["a", "b"].forEach(id => { $(id).onchange = () => { $("by").replaceChildren(); draw(); }; });
["by", "metric", "xscale"].forEach(id => { $(id).onchange = draw; });
start();
