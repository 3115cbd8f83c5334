// The blackbox admin page: plain browser JavaScript, no build step, no outside requests.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 5000;
let nextCursor = null;
let nextSeriesCursor = null;
// Series are read from among every pending id: a page goes on through the cursor at most
// this many calls while it has found fewer than it shows.
const SERIES_CALLS = 10;
const PAGE_SIZE = 50;

function token() { return sessionStorage.getItem("blackbox-token") || ""; }

async function call(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401 || response.status === 403) {
    askToken(answer.reason || "this API needs a token");
    throw new Error(answer.reason || "unauthorized");
  }
  return { status: response.status, answer };
}

function askToken(reason) {
  setStatus(reason, true);
  const dialog = document.getElementById("token-dialog");
  if (!dialog.open) dialog.showModal();
}

function setStatus(text, bad) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = bad ? "error" : "";
}

function when(ms) { return ms === null || ms === undefined ? "–" : new Date(ms).toISOString().replace(".000Z", "Z"); }

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function drawBars(canvasId, labels, values) {
  const canvas = document.getElementById(canvasId);
  const context = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height, bottom = height - 18;
  context.clearRect(0, 0, width, height);
  const most = Math.max(1, ...values);
  const step = width / Math.max(1, values.length);
  context.font = "10px sans-serif";
  values.forEach((value, i) => {
    const bar = Math.round((value / most) * (bottom - 12));
    context.fillStyle = "#3a6ff7";
    context.fillRect(i * step + 1, bottom - bar, Math.max(1, step - 2), bar);
    if (value > 0 && step > 14) {
      context.fillStyle = "#1d2330";
      context.fillText(String(value), i * step + 1, bottom - bar - 2);
    }
  });
  context.fillStyle = "#5b6475";
  const every = Math.ceil(labels.length / 6);
  labels.forEach((label, i) => { if (i % every === 0) context.fillText(label, i * step, height - 4); });
  context.fillText("max " + most, width - 60, 10);
}

async function refreshStats() {
  const { answer } = await call("GET", "/stats");
  document.getElementById("pending").textContent = answer.pending;
  document.getElementById("in-flight").textContent = answer.in_flight;
  document.getElementById("overdue").textContent = answer.overdue;
  document.getElementById("earliest").textContent = when(answer.earliest_due_ms);
  drawBars("per-minute", answer.per_minute.map((b, i) => "+" + i + "m"), answer.per_minute.map((b) => b.count));
  drawBars("per-hour", answer.per_hour.map((b, i) => "+" + i + "h"), answer.per_hour.map((b) => b.count));
}

async function refreshLateness() {
  const { answer } = await call("GET", "/lateness");
  let previous = 0;
  const labels = [], counts = [];
  for (const bucket of answer.buckets) {
    labels.push("≤" + bucket.le);
    counts.push(bucket.count - previous);
    previous = bucket.count;
  }
  drawBars("lateness", labels, counts);
}

function query(path, cursor, extra) {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE), state: document.getElementById("f-state").value, ...extra });
  const caller = document.getElementById("f-caller").value.trim();
  const topic = document.getElementById("f-topic").value.trim();
  if (caller) params.set("caller", caller);
  if (topic) params.set("topic", topic);
  if (cursor) params.set("cursor", cursor);
  return path + "?" + params.toString();
}

function schedulePath(id, verb) {
  return "/schedules/" + encodeURIComponent(id) + (verb ? "/" + verb : "");
}

function button(text, className, onclick) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = text;
  element.className = className;
  element.onclick = onclick;
  return element;
}

function scheduleRow(item) {
  const row = document.createElement("tr");
  row.dataset.id = item.blackbox_id;
  cell(row, when(item.due_ms));
  cell(row, item.blackbox_id, "id");
  cell(row, item.caller);
  cell(row, item.topic);
  cell(row, item.key);
  cell(row, item.attempt);
  cell(row, item.size);
  cell(row, item.preview, "preview");
  const actions = cell(row, "");
  const cancel = button("Cancel", "cancel", () => act("DELETE", item.blackbox_id));
  const seconds = document.createElement("input");
  seconds.type = "number"; seconds.min = "0"; seconds.placeholder = "in seconds"; seconds.className = "countdown";
  seconds.style.width = "6rem";
  const move = button("Reschedule", "reschedule",
    () => act("POST", item.blackbox_id, { countdown: Number(seconds.value || "0") }, "reschedule"));
  actions.append(cancel, " ", seconds, " ", move);
  return row;
}

function ruleText(rule) {
  const parts = [rule.cron !== null ? "cron " + rule.cron : "every " + rule.every + " s"];
  if (rule.start) parts.push("from " + rule.start);
  if (rule.end) parts.push("until " + rule.end);
  if (rule.jitter) parts.push("jitter " + rule.jitter + " s");
  parts.push("missed: " + rule.missed);
  return parts.join(", ");
}

function seriesRow(item) {
  const series = item.series, rule = series.rule;
  const row = document.createElement("tr");
  row.dataset.id = item.blackbox_id;
  // A series' times on its own zone's clock, with the offset: "09:00 in Berlin" reads 09:00.
  cell(row, series.next.length ? series.next[0].local : "–", "next");
  cell(row, item.blackbox_id, "id");
  cell(row, item.caller);
  cell(row, item.topic);
  cell(row, ruleText(rule), "rule");
  cell(row, rule.timezone, "zone");
  cell(row, series.next.map((o) => o.local).join("\n"), "occurrences");
  cell(row, series.fired + " / " + (rule.limit === null ? "∞" : rule.limit), "runs");
  cell(row, series.paused ? "paused" : "active", series.paused ? "state paused" : "state");
  const actions = cell(row, "");
  const hold = series.paused
    ? button("Resume", "resume", () => act("POST", item.blackbox_id, undefined, "resume"))
    : button("Pause", "pause", () => act("POST", item.blackbox_id, undefined, "pause"));
  actions.append(hold, " ", button("Cancel", "cancel", () => act("DELETE", item.blackbox_id)));
  return row;
}

async function act(method, id, body, verb) {
  const { answer } = await call(method, schedulePath(id, verb), body);
  setStatus(id + ": " + (answer.outcome || answer.reason || "done"), false);
  await refreshAll();
}

async function refreshSchedules(append) {
  const { answer } = await call("GET", query("/schedules", append ? nextCursor : null, { kind: "one_off" }));
  const body = document.querySelector("#schedules tbody");
  if (!append) body.replaceChildren();
  answer.items.forEach((item) => body.appendChild(scheduleRow(item)));
  nextCursor = answer.cursor;
  document.getElementById("more").hidden = !nextCursor;
}

async function refreshSeries(append) {
  const items = [];
  let cursor = append ? nextSeriesCursor : null;
  for (let calls = 0; calls < SERIES_CALLS; calls++) {
    const { answer } = await call("GET", query("/series", cursor, {}));
    items.push(...answer.items);
    cursor = answer.cursor;
    if (!cursor || items.length >= PAGE_SIZE) break;
  }
  const body = document.querySelector("#series tbody");
  if (!append) body.replaceChildren();
  items.forEach((item) => body.appendChild(seriesRow(item)));
  nextSeriesCursor = cursor;
  document.getElementById("more-series").hidden = !nextSeriesCursor;
}

async function refreshDeadLetters() {
  const { answer } = await call("GET", "/dead-letters?limit=20");
  const body = document.querySelector("#dead-letters tbody");
  body.replaceChildren();
  for (const letter of answer.items) {
    const row = document.createElement("tr");
    cell(row, when(letter.at_ms));
    cell(row, letter.reason);
    cell(row, letter.detail);
    cell(row, letter.blackbox_id);
    cell(row, letter.preview, "preview");
    body.appendChild(row);
  }
}

async function refreshAll() {
  try {
    await Promise.all([refreshStats(), refreshLateness(), refreshSeries(false), refreshSchedules(false),
      refreshDeadLetters()]);
    setStatus("updated " + new Date().toLocaleTimeString(), false);
  } catch (error) {
    if (!document.getElementById("token-dialog").open) setStatus(String(error.message || error), true);
  }
}

document.getElementById("search").addEventListener("submit", (event) => { event.preventDefault(); refreshAll(); });
document.getElementById("more").addEventListener("click", () => refreshSchedules(true));
document.getElementById("more-series").addEventListener("click", () => refreshSeries(true));
document.getElementById("token-button").addEventListener("click", () => askToken("enter the API token"));
document.getElementById("token-form").addEventListener("submit", () => {
  sessionStorage.setItem("blackbox-token", document.getElementById("token-input").value);
  refreshAll();
});
refreshAll();
setInterval(refreshAll, REFRESH_MS);
