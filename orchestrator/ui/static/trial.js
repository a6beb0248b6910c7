// One trial's full trace (acc and metrics, losses, learning rate), growing while it runs.
const store = {};
let cursor = null;

function numericMetrics(t) {
  const names = new Set();
  (t.metrics || []).forEach(m => { if (m) Object.entries(m).forEach(([k, v]) => { if (typeof v === "number") names.add(k); }); });
  return [...names];
}

function draw() {
  const ids = Object.keys(store);
  const t = ids.length ? store[ids[0]] : { step: [], acc: [], loss: [], train_loss: [], step_lr: [], metrics: [] };
  // Metric names come from stored (imported) trace points: plotText keeps them text.
  const line = (y, name, ax) => ({ type: "scatter", mode: "lines+markers", x: t.step, y: y, name: plotText(name), xaxis: "x" + ax, yaxis: "y" + ax, marker: { size: 4 } });
  const data = [line(t.acc, "acc", ""), line(t.loss, "loss", "2"), line(t.train_loss, "train_loss", "2"), line(t.step_lr, "lr", "3")];
  numericMetrics(t).forEach(k => data.push(line(t.metrics.map(m => m ? m[k] : null), k, "")));
  Plotly.react("trace", data, {
    grid: { rows: 3, columns: 1, pattern: "independent" }, height: 640, margin: { t: 20, r: 10, b: 40, l: 60 },
    yaxis: { title: { text: "acc" } }, yaxis2: { title: { text: "loss" } },
    yaxis3: { title: { text: "lr" }, type: "log", exponentformat: "power" },
    xaxis3: { title: { text: "step" } }, uirevision: "trial",
  }, { displaylogo: false });
}

async function poll() {
  const q = new URLSearchParams({ key: PAGE.key, full: "1" });
  if (cursor) q.set("since", cursor);
  try {
    const tr = await getJSON(apiBase() + "/traces?" + q);
    cursor = tr.cursor;
    if (mergeTraces(store, tr) > 0 || !document.getElementById("trace").data) draw();
  } catch (e) { /* keep what is drawn */ }
}
poll();
setInterval(poll, POLL_MS);
