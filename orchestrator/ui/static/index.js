// The sweep list refreshes itself from /api/sweeps.
function hms(s) {
  if (!s) return "";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
  return h + ":" + String(m).padStart(2, "0") + ":" + String(x).padStart(2, "0");
}
async function refresh() {
  try {
    const r = await fetch("/api/sweeps");
    const data = await r.json();
    const body = document.querySelector("#sweeps tbody");
    body.innerHTML = "";
    for (const s of data.sweeps) {
      const tr = document.createElement("tr");
      tr.dataset.sweep = s.name;
      const counts = Object.entries(s.counts).filter(([k, v]) => v)
        .map(([k, v]) => `<span class="st st-${k}">${k} ${v}</span>`).join(" ");
      const cells = [null, s.description, s.total, counts,
                     s.progress === null ? "" : Math.round(100 * s.progress) + "%",
                     hms(s.eta_s), s.started_at || "", s.updated_at || ""];
      const a = document.createElement("a");
      a.className = "sweep-link"; a.href = "/sweeps/" + encodeURIComponent(s.name);
      a.textContent = s.name;
      const td0 = document.createElement("td"); td0.appendChild(a); tr.appendChild(td0);
      cells.slice(1).forEach((v, i) => {
        const td = document.createElement("td");
        if (i === 2) td.innerHTML = v; else td.textContent = v;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
  } catch (e) { /* keep the last table; the next poll tries again */ }
}
setInterval(refresh, window.POLL_MS);
