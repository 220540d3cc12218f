// The execkit dashboard: reads /dashboard/api/snapshot every few seconds and draws the
// board, the blocked cards, the retries, the runs in flight, the lanes (when the ledger has
// them) and a chart of attempts over time. Text from the ledger only ever goes through
// textContent, never innerHTML. No library, no build step: this file is what runs.
"use strict";

const API = "/dashboard/api";
const REFRESH_MS = Number(new URLSearchParams(location.search).get("refresh_ms")) || 5000;
const CLASSES = ["work", "environment", "upstream", "abandoned", "succeeded"];
const COLORS = { work: "#c0392b", environment: "#8e44ad", upstream: "#d68910",
  abandoned: "#7f8c8d", succeeded: "#229954" };
let session = null;
let timer = null;
let openTask = null;

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function when(at, now) {
  if (at === null || at === undefined) return "-";
  const delta = at - now;
  const abs = Math.abs(delta);
  if (Number.isNaN(abs)) return "-";
  // The same words as the CLI's (execkit/_stamp.py `span`), whatever the value.
  const text = abs < 90 ? `${abs.toFixed(0)}s` : abs < 5400 ? `${(abs / 60).toFixed(0)}m`
    : abs < 172800 ? `${(abs / 3600).toFixed(1)}h`
    : abs < 100 * 365.25 * 86400 ? `${(abs / 86400).toFixed(1)}d` : "over 100 years";
  return delta > 0 ? `in ${text}` : `${text} ago`;
}

function clock(at) {
  if (at === null || at === undefined) return "-";
  // A time no calendar holds (a vendor's absurd reset) is worded, never "Invalid Date".
  const date = new Date(at * 1000);
  if (Number.isNaN(date.getTime())) return Number.isFinite(at) && at > 0 ? "far in the future" : "an unreadable time";
  return date.toLocaleString();
}

// An issue as a row names it: its id and, when the board gave one, its title.
function issueName(item) {
  if (!item.issue) return "-";
  return item.issue_title ? `${item.issue} ${item.issue_title}` : item.issue;
}

function attempts(card) {
  return `${card.attempts}/${card.max_attempts === null ? "-" : card.max_attempts}`;
}

async function call(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (session && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  }
  const answer = await fetch(path, { method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body) });
  let doc = null;
  try { doc = await answer.json(); } catch (_) { doc = null; }
  return { status: answer.status, doc };
}

function showSignIn(message) {
  session = null;
  if (timer) clearTimeout(timer);
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("who").textContent = "";
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
}

async function signIn(event) {
  event.preventDefault();
  const input = $("token");
  const { status, doc } = await call("POST", `${API}/session`, { token: input.value });
  input.value = "";
  if (status !== 200) {
    showSignIn(doc && doc.error ? doc.error.message : `sign-in refused (${status})`);
    return;
  }
  start(doc);
}

async function signOut() {
  await call("POST", `${API}/session/close`, {});
  showSignIn("signed out");
}

function start(doc) {
  session = doc;
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  $("who").textContent = `${doc.actor} (${doc.can_operate ? "operator" : "viewer"})`;
  refresh();
  const match = location.pathname.match(/^\/dashboard\/tasks\/(.+)$/);
  if (match) showTask(decodeURIComponent(match[1]));
}

async function retryOnce(taskId, button) {
  button.disabled = true;
  const { status, doc } = await call("POST",
    `${API}/tasks/${encodeURIComponent(taskId)}/retry-once`, {});
  if (status !== 200) {
    $("status").textContent = `retry once refused: ${doc && doc.error ? doc.error.message : status}`;
    button.disabled = false;
    return;
  }
  $("status").textContent = `${taskId}: retry once requested`;
  refresh();
}

function resumeButton(lane) {
  const button = el("button", { class: "resume-lane", type: "button", "data-lane": lane }, "resume");
  button.addEventListener("click", async () => {
    button.disabled = true;
    const path = lane.split("/").map(encodeURIComponent).join("/");
    const { status, doc } = await call("POST", `${API}/lanes/${path}/resume`, {});
    $("status").textContent = status === 200 ? `${lane}: resumed`
      : `resume refused: ${doc && doc.error ? doc.error.message : status}`;
    refresh();
  });
  return button;
}

function cardNode(card, now, canOperate) {
  const klass = card.blocked_on || card.last_class;
  // A board issue never dispatched has no task yet: nothing to open.
  const node = el("div", { class: `card c-${klass || "none"}`, "data-task-id": card.task_id,
    "data-issue": card.issue, "data-state": card.state,
    onclick: card.task_id ? () => showTask(card.task_id) : null },
  el("div", { class: "id" }, card.issue || card.title),
  card.issue_title ? el("div", { class: "title" }, card.issue_title) : null,
  el("div", { class: "meta" }, card.task_id === null ? "not dispatched yet"
    : `${card.task_id} · ${card.state} · attempt ${attempts(card)} · charged ${card.charged}`
    + (card.uncharged_streak ? ` · uncharged ${card.uncharged_streak}` : "")
    + (card.next_attempt_at ? ` · next ${when(card.next_attempt_at, now)}` : "")));
  if (card.state === "blocked") {
    node.append(el("div", { class: "reason" }, `blocked on ${card.blocked_on}: ${card.reason || "-"}`));
    if (card.blocked_on === "work" && card.last_reason) {
      node.append(el("div", { class: "reason last" }, `last failure: ${card.last_reason}`));
    }
    node.append(el("div", { class: "fix" }, `fix: ${card.fix || "-"}`));
    if (canOperate) {
      const button = el("button", { class: "retry-once", type: "button",
        "data-task-id": card.task_id }, "retry once");
      button.addEventListener("click", (event) => {
        event.stopPropagation();
        retryOnce(card.task_id, button);
      });
      node.append(button);
    }
  } else if (card.last_class) {
    node.append(el("div", { class: "reason" }, `last: ${card.last_class}: ${card.last_reason || "-"}`));
  }
  return node;
}

function drawBoard(snap) {
  const board = $("board");
  board.replaceChildren(...snap.columns.map((column) => {
    const node = el("div", { class: "column", "data-column": column.state },
      el("h3", {}, `${column.state} (${column.count})`));
    for (const card of column.cards) node.append(cardNode(card, snap.now, snap.can_operate));
    if (column.more) node.append(el("div", { class: "more" }, `and ${column.more} more`));
    return node;
  }));
  const blocked = $("blocked");
  blocked.replaceChildren(...(snap.blocked.length ? snap.blocked.map(
    (card) => cardNode(card, snap.now, snap.can_operate)) : [el("p", { class: "muted" }, "none")]));
}

function rows(tbody, items, cells) {
  const body = $(tbody).querySelector("tbody");
  body.replaceChildren(...items.map((item) => el("tr", {}, ...cells(item).map((c) => el("td", {}, c)))));
}

function drawTables(snap) {
  rows("retries", snap.retries, (c) => [issueName(c), c.task_id, attempts(c), c.charged,
    c.uncharged_streak, c.next_attempt_at ? when(c.next_attempt_at, snap.now) : "due",
    c.last_class || "-", c.last_reason || "-"]);
  rows("in-flight", snap.in_flight, (r) => [issueName(r), r.task_id, r.run_id, r.attempt,
    r.host ? `${r.host}:${r.pid}` : "-", r.dispatcher, when(r.since, snap.now),
    when(r.lease_expires_at, snap.now), r.workspace || "-"]);
  // Hidden until some run has used a lane (or when the ledger has none).
  $("lanes-panel").hidden = !snap.lanes || snap.lanes.length === 0;
  if (snap.lanes) {
    rows("lanes", snap.lanes, (l) => [l.lane || "-", l.state || "-",
      (l.reason || "-") + (l.capped ? " (the vendor's reset was further away: capped)" : ""),
      opens(l, snap.now),
      snap.can_operate && l.state !== "open" ? resumeButton(l.lane) : ""]);
    const lines = $("lanes").querySelectorAll("tbody tr");
    snap.lanes.forEach((l, i) => { lines[i].dataset.lane = l.lane; lines[i].dataset.state = l.state; });
  }
  // Spend (issue #45): hidden until a cap is set or a run reported a cost today.
  const spend = snap.spend;
  $("spend-panel").hidden = !spend || (spend.windows.length === 0 && spend.lanes_today.length === 0);
  if (spend) {
    rows("spend-windows", spend.windows, (w) => [w.name, money(w.usd, w.tokens),
      money(w.cap_usd, w.cap_tokens), `${when(w.reopens_at, snap.now)} (${clock(w.reopens_at)})`,
      w.overridden_until ? `overridden until ${clock(w.overridden_until)}` : w.full ? "full" : "room"]);
    rows("spend-lanes", spend.lanes_today, (l) => [l.lane,
      `$${l.usd.toFixed(2)}${l.unknown_usd ? ` (+${l.unknown_usd} unknown)` : ""}`,
      l.tokens.toLocaleString("en-US"), l.runs]);
  }
  // Where people are told (issue #49): hidden until an endpoint is added.
  $("notify-panel").hidden = !snap.notify || snap.notify.length === 0;
  if (snap.notify) {
    rows("notify", snap.notify, (n) => [n.id, n.url, n.format, (n.events || []).join(", "),
      n.stopped_reason ? `stopped: ${n.stopped_reason}` : (n.backlog && n.last_error
        ? `retrying: ${n.last_error}` : "ok"),
      n.delivered, n.failed, n.backlog]);
  }
}

// "$1.20 and 3,000 tokens", either part left out when it is null.
function money(usd, tokens) {
  const parts = [];
  if (usd !== null && usd !== undefined) parts.push(`$${Number(usd).toFixed(2)}`);
  if (tokens !== null && tokens !== undefined) parts.push(`${Number(tokens).toLocaleString("en-US")} tokens`);
  return parts.join(" and ") || "-";
}

// When a lane opens: at its time (parked, cooling), on its probe's result (half open), or
// only when an operator resumes it (stopped).
function opens(lane, now) {
  if (lane.state === "open") return "-";
  if (lane.state === "stopped") return "when an operator resumes it";
  if (lane.opens_at) return `${when(lane.opens_at, now)} (${clock(lane.opens_at)})`;
  return lane.admits ? "now: one probe attempt first" : "on its probe attempt's result";
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

// Stacked bars per time slice (one colour per class); beneath each bar a thin strip
// splits the same attempts into charged (dark) and uncharged (light). `peak` is the scale
// (shared by the lanes' small charts, so their bars compare).
function bars(buckets, peak, size) {
  const { width, height, pad, strip } = size;
  const barW = (width - pad * 2) / buckets.length;
  // A viewBox, so the stylesheet can shrink the chart to a narrow window (max-width).
  const root = svg("svg", { width, height: height + strip + 8, role: "img",
    viewBox: `0 0 ${width} ${height + strip + 8}` });
  root.append(svg("line", { x1: pad, y1: height, x2: width - pad, y2: height, stroke: "#999" }));
  const label = svg("text", { x: 2, y: 12, "font-size": 10 });
  label.textContent = String(peak);
  root.append(label);
  buckets.forEach((b, i) => {
    let y = height;
    const x = pad + i * barW + 1;
    for (const klass of CLASSES) {
      if (!b[klass]) continue;
      const h = (b[klass] / peak) * (height - 10);
      y -= h;
      const rect = svg("rect", { x, y, width: Math.max(1, barW - 2), height: h,
        fill: COLORS[klass], "data-class": klass, "data-count": b[klass] });
      const title = svg("title", {});
      title.textContent = `${klass}: ${b[klass]}`;
      rect.append(title);
      root.append(rect);
    }
    const total = b.charged + b.uncharged;
    if (total) {
      const cw = (b.charged / total) * (barW - 2);
      root.append(svg("rect", { x, y: height + 4, width: cw, height: strip, fill: "#333",
        "data-charged": b.charged }));
      root.append(svg("rect", { x: x + cw, y: height + 4, width: (barW - 2) - cw, height: strip,
        fill: "#bbb", "data-uncharged": b.uncharged }));
    }
  });
  return root;
}

function peakOf(buckets) {
  return Math.max(1, ...buckets.map((b) => CLASSES.reduce((n, k) => n + b[k], 0)));
}

function drawChart(chart) {
  const size = { width: 760, height: 180, pad: 28, strip: 10 };
  const root = bars(chart.buckets, peakOf(chart.buckets), size);
  root.setAttribute("id", "chart-svg");
  root.setAttribute("height", String(size.height + size.strip + 30));
  root.setAttribute("viewBox", `0 0 ${size.width} ${size.height + size.strip + 30}`);
  root.setAttribute("aria-label", "attempts over time by class, charged against uncharged");
  const start = svg("text", { x: size.pad, y: size.height + size.strip + 24, "font-size": 10 });
  start.textContent = clock(chart.start);
  const end = svg("text", { x: size.width - size.pad, y: size.height + size.strip + 24,
    "font-size": 10, "text-anchor": "end" });
  end.textContent = clock(chart.end);
  root.append(start, end);
  const legend = el("div", { class: "legend" },
    ...CLASSES.map((k) => {
      const swatch = el("i");
      swatch.style.background = COLORS[k]; // CSSOM: allowed under the page's CSP
      return el("span", {}, swatch, k);
    }),
    el("span", {}, "strip: charged (dark) / uncharged (light)"));
  $("chart").replaceChildren(root, legend);
  drawLaneCharts(chart);
}

// Small multiples: the same slices once per lane (at most 8 lanes, then "other lanes" and
// "no lane"; the server bounds them), on one shared scale.
function drawLaneCharts(chart) {
  const box = $("lane-charts");
  const lanes = chart.lanes || [];
  box.hidden = lanes.length === 0;
  if (!lanes.length) { box.replaceChildren(); return; }
  const peak = Math.max(1, ...lanes.map((l) => peakOf(l.buckets)));
  const size = { width: 250, height: 70, pad: 18, strip: 5 };
  const items = lanes.map((lane) => {
    const root = bars(lane.buckets, peak, size);
    root.setAttribute("aria-label", `attempts over time on ${lane.lane}`);
    return el("figure", { class: "lane-chart", "data-lane": lane.lane,
      "data-attempts": lane.attempts, "data-charged": lane.charged,
      "data-uncharged": lane.uncharged },
    el("figcaption", {}, el("b", {}, lane.lane),
      ` · ${lane.attempts} attempts · ${lane.charged} charged · ${lane.uncharged} uncharged`),
    root);
  });
  if (chart.lanes_unread) {
    items.push(el("p", { class: "muted" }, `${chart.lanes_unread} lanes not read (the page reads at most 64)`));
  }
  box.replaceChildren(el("h3", {}, "per lane"), ...items);
}

async function refresh() {
  if (timer) clearTimeout(timer);
  const { status, doc } = await call("GET", `${API}/snapshot`);
  if (status === 401) { showSignIn("your session ended: sign in again"); return; }
  if (status === 200) {
    const counts = Object.entries(doc.counts).map(([k, v]) => `${k} ${v}`).join(" · ");
    $("counts").textContent = counts;
    drawChart(doc.chart);
    drawBoard(doc);
    drawTables(doc);
    document.body.dataset.refreshedAt = String(doc.now);
    // A board file that cannot be read: its last good reading stays, and the reason shows.
    if (doc.board_error) $("status").textContent = `the board file: ${doc.board_error}`;
    if (openTask) showTask(openTask, true);
  } else {
    $("status").textContent = `the server answered ${status}: ${doc && doc.error ? doc.error.message : ""}`;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

async function showTask(taskId, quiet) {
  const { status, doc } = await call("GET", `${API}/tasks/${encodeURIComponent(taskId)}`);
  if (status !== 200) {
    if (!quiet) $("status").textContent = `task ${taskId}: ${doc && doc.error ? doc.error.message : status}`;
    return;
  }
  openTask = taskId;
  const card = doc.card;
  $("task-panel").hidden = false;
  $("task-title").textContent = `${card.task_id} ${card.issue ? `(${issueName(card)})` : card.title}`;
  $("task-summary").textContent = `${card.state}${card.blocked_on ? ` on ${card.blocked_on}` : ""}`
    + ` · attempt ${attempts(card)} · charged ${card.charged} · ${card.reason || ""}`;
  $("task-spend").textContent = doc.spend && doc.spend.runs ? `cost: ${doc.spend.phrase}` : "";
  rows("task-runs", doc.runs, (r) => [r.attempt, r.status, r.class,
    r.charged === null ? "-" : r.charged ? "charged" : "uncharged", r.reason || "-", r.actor,
    clock(r.started_at), clock(r.ended_at)]);
}

async function boot() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("task-close").addEventListener("click", () => { openTask = null; $("task-panel").hidden = true; });
  const { status, doc } = await call("GET", `${API}/session`);
  if (status === 200) start(doc); else showSignIn("");
}

document.addEventListener("DOMContentLoaded", boot);
