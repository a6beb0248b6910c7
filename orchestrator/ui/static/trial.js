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

// What the worker's process was doing at each eval step (system_metrics): CPU %, RSS,
// steps/s and, on a GPU, the device's utilisation and memory. The page carries the samples
// so far as JSON; while the trial runs they are fetched again with the trace.
let system = JSON.parse(document.getElementById("system").dataset.series || "{}");

function drawSystem() {
  const s = system;
  if (!s.step || !s.step.length) return;
  document.getElementById("system-none").hidden = true;
  const line = (y, name, ax) => ({ type: "scatter", mode: "lines+markers", x: s.step, y: y, name: name, xaxis: "x" + ax, yaxis: "y" + ax, marker: { size: 4 } });
  const data = [line(s.cpu_pct, "CPU %", ""), line(s.rss_mb, "RSS (MiB)", "2"), line(s.steps_per_s, "steps/s", "3")];
  const gpu = "gpu_util_pct" in s;
  if (gpu) data.push(line(s.gpu_util_pct, "GPU util %", ""), line(s.gpu_mem_mb, "GPU memory (MiB)", "2"));
  Plotly.react("system", data, {
    grid: { rows: 3, columns: 1, pattern: "independent" }, height: 520, margin: { t: 20, r: 10, b: 40, l: 60 },
    yaxis: { title: { text: gpu ? "CPU / GPU %" : "CPU %" }, rangemode: "tozero" },
    yaxis2: { title: { text: "MiB" }, rangemode: "tozero" },
    yaxis3: { title: { text: "steps/s" }, rangemode: "tozero" },
    xaxis3: { title: { text: "step" } }, uirevision: "system",
  }, { displaylogo: false });
}

async function pollSystem() {
  if (PAGE.status !== "running") return;
  try {
    system = await getJSON(apiBase() + "/trials/" + encodeURIComponent(PAGE.key) + "/system");
    drawSystem();
  } catch (e) { /* keep what is drawn */ }
}
DOM_READY.then(drawSystem);
setInterval(pollSystem, POLL_MS);
