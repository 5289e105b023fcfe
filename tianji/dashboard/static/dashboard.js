// tianji dashboard: polls /api/status and /api/metrics every second and draws plain SVG.
// No library, no request beyond this server.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const W = 560, H = 240, PAD = { left: 56, right: 12, top: 10, bottom: 28 };
const MAX_DOTS = 1000;

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  if (Number.isInteger(v)) return String(v);
  return v.toFixed(a >= 100 ? 0 : 1);
}

function extent(values, zero) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
  if (zero) lo = Math.min(lo, 0);
  if (!Number.isFinite(lo)) return [0, 1];
  if (hi === lo) hi = lo + 1;
  return [lo, hi];
}

// Axes with min/max ticks; returns functions mapping data to pixels.
function frame(svg, xs, ys, xlabel, zeroY, xticks = true) {
  svg.replaceChildren();
  const [x0, x1] = extent(xs, false), [y0, y1] = extent(ys, zeroY);
  const pw = W - PAD.left - PAD.right, ph = H - PAD.top - PAD.bottom;
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * pw;
  const sy = (y) => PAD.top + ph - ((y - y0) / (y1 - y0)) * ph;
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4, py = sy(y);
    el("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: py, y2: py }, svg);
    el("text", { x: PAD.left - 6, y: py + 4, "text-anchor": "end" }, svg).textContent = fmt(y);
  }
  el("line", { class: "axis", x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom }, svg);
  el("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom }, svg);
  const base = H - PAD.bottom + 16;
  if (xticks) {
    el("text", { x: PAD.left, y: base }, svg).textContent = fmt(x0);
    el("text", { x: W - PAD.right, y: base, "text-anchor": "end" }, svg).textContent = fmt(x1);
  }
  el("text", { x: PAD.left + pw / 2, y: base, "text-anchor": "middle" }, svg).textContent = xlabel;
  return { sx, sy };
}

function empty(svg, why) {
  svg.replaceChildren();
  el("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, svg).textContent = why;
}

// series: [{name, points: [[x, y], ...], dots: bool}]; drawn in order, class c<i>.
function linePlot(svg, series, xlabel, zeroY) {
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) return empty(svg, "waiting for data");
  const { sx, sy } = frame(svg, all.map((p) => p[0]), all.map((p) => p[1]), xlabel, zeroY);
  series.forEach((s, i) => {
    if (s.dots) {
      const g = el("g", { class: "points", "data-series": s.name, "data-points": s.points.length }, svg);
      for (const [x, y] of s.points) el("circle", { class: "point c" + i, cx: sx(x), cy: sy(y), r: 2.5 }, g);
    } else if (s.points.length > 0) {
      const pts = s.points.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ");
      el("polyline", { class: "c" + (i % 8), points: pts, "data-series": s.name, "data-points": s.points.length }, svg);
    }
  });
}

// A histogram as one bar per key, side by side whatever the keys' values (exact lags 0, 1,
// 2 ... or the power-of-two buckets of a replay run's ages, 32 ... 4096): every bar has room,
// at most ~10 key labels are printed below (the others skipped evenly), the y axis is the
// share of consumed samples in percent with as many decimals as its ticks need.
function barPlot(svg, histogram, xlabel) {
  const keys = Object.keys(histogram).map(Number).sort((a, b) => a - b);
  const total = keys.reduce((n, k) => n + histogram[k], 0);
  if (total === 0) return empty(svg, "no sample consumed yet");
  const shares = keys.map((k) => (100 * histogram[k]) / total);
  const ymax = Math.max(...shares) * 1.15;  // room for the labels above the bars
  svg.replaceChildren();
  const pw = W - PAD.left - PAD.right, ph = H - PAD.top - PAD.bottom;
  const sy = (y) => PAD.top + ph - (y / ymax) * ph;
  const decimals = ymax / 4 >= 10 ? 0 : ymax / 4 >= 1 ? 1 : 2;
  for (let i = 0; i <= 4; i++) {
    const y = (ymax * i) / 4, py = sy(y);
    el("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: py, y2: py }, svg);
    el("text", { x: PAD.left - 6, y: py + 4, "text-anchor": "end" }, svg).textContent =
      y.toFixed(decimals) + "%";
  }
  el("line", { class: "axis", x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom }, svg);
  el("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom }, svg);
  const slot = pw / keys.length, every = Math.ceil(keys.length / 10);
  const g = el("g", { class: "bars", "data-series": "lag", "data-points": keys.length }, svg);
  keys.forEach((k, i) => {
    const centre = PAD.left + slot * (i + 0.5), top = sy(shares[i]);
    const h = Math.max(1, PAD.top + ph - top);  // a share that rounds to nothing still shows
    el("rect", { class: "bar", x: centre - slot * 0.35, y: PAD.top + ph - h, width: slot * 0.7, height: h }, g);
    if (keys.length <= 12) {
      el("text", { x: centre, y: PAD.top + ph - h - 3, "text-anchor": "middle" }, g)
        .textContent = shares[i].toFixed(shares[i] >= 10 ? 0 : 1) + "%";
    }
    if (i % every === 0) {
      el("text", { class: "tick", x: centre, y: H - PAD.bottom + 12, "text-anchor": "middle" }, g)
        .textContent = fmt(k);
    }
  });
  el("text", { x: PAD.left + pw / 2, y: H - 2, "text-anchor": "middle" }, svg).textContent = xlabel;
}

function column(rows, x, y) {
  return rows.filter((r) => r[x] !== null && r[y] !== null).map((r) => [r[x], r[y]]);
}

function drawMetrics(m) {
  const eps = m.episodes.slice(-MAX_DOTS).map((e) => [e.env_steps, e.return]);
  linePlot(document.getElementById("plot-return"), [
    { name: "episodes", points: eps, dots: true },
    { name: "mean_return", points: column(m.rows, "env_steps", "mean_return") },
  ], "env steps", false);
  linePlot(document.getElementById("plot-rate"), [
    { name: "env_steps_per_s", points: column(m.rows.slice(1), "t", "env_steps_per_s") },
  ], "seconds", true);
  const evals = (m.evaluations || []).map((e) => [e.policy_version, e.mean]);
  evals.sort((a, b) => a[0] - b[0]);
  linePlot(document.getElementById("plot-eval"), [
    { name: "eval_return", points: evals },
  ], "policy version", false);
  drawMembers(m.rows);
  linePlot(document.getElementById("plot-balance"), [
    { name: "production_per_s", points: column(m.rows, "t", "production_per_s") },
    { name: "consumption_per_s", points: column(m.rows, "t", "consumption_per_s") },
  ], "seconds", true);
}

// A population run: one line per member (its mean return over its own env steps), in the
// colours c0 ... c7 (repeating past 8 members), with a legend; hidden for one policy.
function drawMembers(rows) {
  const last = rows.length ? rows[rows.length - 1].members : null;
  const figure = document.getElementById("members-figure");
  figure.hidden = !last;
  if (!last) return;
  const names = Object.keys(last).sort();
  const series = names.map((name) => ({
    name: name,
    points: rows
      .filter((r) => r.members && r.members[name] && r.members[name].mean_return !== null)
      .map((r) => [r.members[name].env_steps, r.members[name].mean_return]),
  }));
  const legend = document.getElementById("members-legend");
  legend.replaceChildren();
  names.forEach((name, i) => {
    const item = document.createElement("span");
    item.className = "c" + (i % 8);
    item.textContent = "— " + name + " ";
    legend.appendChild(item);
  });
  linePlot(document.getElementById("plot-members"), series, "env steps (each member's)", false);
}

const COUNTERS = [
  ["env_steps", "env steps"], ["episodes", "episodes"], ["mean_return", "mean return"],
  ["eval_return", "eval return"],
  ["learner_updates", "learner updates"], ["samples_produced", "samples produced"],
  ["samples_consumed", "samples consumed"], ["lag_mean", "mean lag"],
];

function cell(tr, value) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "–" : value;
  tr.appendChild(td);
}

function drawStatus(s) {
  document.getElementById("title").textContent = s.title || "tianji run";
  document.title = "tianji: " + (s.title || "run");
  const state = document.getElementById("state");
  state.textContent = s.state + (s.stop_reason ? " (" + s.stop_reason + ")" : "");
  state.className = "state " + s.state;
  document.getElementById("run").textContent = "run " + s.run_id + ", " + fmt(s.elapsed_s) + " s";
  const stalled = s.controller && s.controller.stalled;
  const banner = document.getElementById("stalled");
  banner.hidden = !stalled;
  banner.textContent = stalled
    ? "Stalled: nothing produced or consumed for " + fmt(stalled.seconds) + " s. " + stalled.state
    : "";
  const links = s.links_down || [];
  const down = document.getElementById("links-down");
  down.hidden = links.length === 0;
  down.textContent = links.length
    ? "Links down: " + links.map((l) => l.subscriber + " -> " + l.publisher + ": " + l.error).join("; ")
    : "";
  const box = document.getElementById("counters");
  box.replaceChildren();
  const dropped = Object.values(s.counters.samples_dropped).reduce((a, b) => a + b, 0);
  for (const [key, label] of COUNTERS.concat([["dropped", "samples dropped"]])) {
    const div = document.createElement("div");
    const value = key === "dropped" ? dropped : s.counters[key];
    div.innerHTML = "<span></span><small></small>";
    div.firstChild.textContent = fmt(value);
    div.lastChild.textContent = key === "lag_mean" && s.on_policy === false ? "mean sample age" : label;
    box.appendChild(div);
  }
  const replay = s.on_policy === false;
  document.getElementById("lag-caption").textContent = replay
    ? "Age of replayed samples when drawn (learner updates since collected)"
    : "Policy lag of consumed samples (versions)";
  barPlot(document.getElementById("plot-lag"), s.lag_histogram,
    replay ? "sample age (updates); share of draws" : "lag (versions); share of consumed samples");
  const body = document.querySelector("#services tbody");
  body.replaceChildren();
  for (const svc of s.services) {
    const tr = document.createElement("tr");
    tr.className = "service " + svc.state;
    tr.dataset.name = svc.name;
    const age = svc.last_heartbeat_age_s === null ? null : svc.last_heartbeat_age_s.toFixed(1) + " s ago";
    for (const v of [svc.name, svc.role, svc.index, svc.host, svc.pid, svc.state, age, svc.restarts, svc.queue_depth]) {
      cell(tr, v);
    }
    body.appendChild(tr);
  }
}

async function refresh() {
  try {
    const [status, metrics] = await Promise.all([
      fetch("api/status").then((r) => r.json()),
      fetch("api/metrics").then((r) => r.json()),
    ]);
    drawStatus(status);
    drawMetrics(metrics);
  } catch (err) {
    const state = document.getElementById("state");
    state.textContent = "disconnected (the run has ended?)";
    state.className = "state disconnected";
  }
  setTimeout(refresh, 1000);
}

refresh();
