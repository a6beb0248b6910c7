// The sweep list refreshes itself from /api/sweeps. The ETA column is the server's estimate
// from the recent rate (orchestrator/eta.py), or why there is none: done, not running,
// estimating (the first minute of progress).
function hms(s) {
  if (s === null || s === undefined) return "";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
  return h + ":" + String(m).padStart(2, "0") + ":" + String(x).padStart(2, "0");
}
function row(s) {
  const tr = document.createElement("tr");
  tr.dataset.sweep = s.name;
  const a = el("a", s.name, "sweep-link");
  a.href = "/sweeps/" + encodeURIComponent(s.name);
  const counts = el("td");
  Object.entries(s.counts).filter(([k, v]) => v).forEach(([k, v]) => {
    counts.append(el("span", k + " " + v, "st st-" + k), " ");
  });
  const cells = [el("td"), el("td", s.description), el("td", s.total), counts,
                 el("td", s.progress === null ? "" : Math.round(100 * s.progress) + "%"),
                 el("td", s.eta_s === null || s.eta_s === undefined ? s.eta_note || "" : hms(s.eta_s), "eta"),
                 el("td", s.started_at || ""), el("td", s.updated_at || "")];
  cells[0].appendChild(a);
  tr.append(...cells);
  return tr;
}
// Rows are rebuilt only when the list changed: a rebuild drops the reader's text selection
// and any element a script holds.
let shown = null;
async function refresh() {
  try {
    const data = await getJSON("/api/sweeps");
    const text = JSON.stringify(data.sweeps);
    if (text === shown) return;
    shown = text;
    document.querySelector("#sweeps tbody").replaceChildren(...data.sweeps.map(row));
  } catch (e) { /* keep the last table; the next poll tries again */ }
}
setInterval(refresh, POLL_MS);
