// The blackbox admin page: plain browser JavaScript, no build step, no outside requests.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 5000;
let nextCursor = null;

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

function query(cursor) {
  const params = new URLSearchParams({ limit: "50", state: document.getElementById("f-state").value });
  const caller = document.getElementById("f-caller").value.trim();
  const topic = document.getElementById("f-topic").value.trim();
  if (caller) params.set("caller", caller);
  if (topic) params.set("topic", topic);
  if (cursor) params.set("cursor", cursor);
  return "/schedules?" + params.toString();
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
  const cancel = document.createElement("button");
  cancel.textContent = "Cancel";
  cancel.className = "cancel";
  cancel.onclick = () => act("DELETE", item.blackbox_id);
  const seconds = document.createElement("input");
  seconds.type = "number"; seconds.min = "0"; seconds.placeholder = "in seconds"; seconds.className = "countdown";
  seconds.style.width = "6rem";
  const move = document.createElement("button");
  move.textContent = "Reschedule";
  move.className = "reschedule";
  move.onclick = () => act("POST", item.blackbox_id, { countdown: Number(seconds.value || "0") });
  actions.append(cancel, " ", seconds, " ", move);
  return row;
}

async function act(method, id, body) {
  const path = "/schedules/" + encodeURIComponent(id) + (body ? "/reschedule" : "");
  const { answer } = await call(method, path, body);
  setStatus(id + ": " + (answer.outcome || answer.reason || "done"), false);
  await refreshAll();
}

async function refreshSchedules(append) {
  const { answer } = await call("GET", query(append ? nextCursor : null));
  const body = document.querySelector("#schedules tbody");
  if (!append) body.replaceChildren();
  answer.items.forEach((item) => body.appendChild(scheduleRow(item)));
  nextCursor = answer.cursor;
  document.getElementById("more").hidden = !nextCursor;
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
    await Promise.all([refreshStats(), refreshLateness(), refreshSchedules(false), refreshDeadLetters()]);
    setStatus("updated " + new Date().toLocaleTimeString(), false);
  } catch (error) {
    if (!document.getElementById("token-dialog").open) setStatus(String(error.message || error), true);
  }
}

document.getElementById("search").addEventListener("submit", (event) => { event.preventDefault(); refreshAll(); });
document.getElementById("more").addEventListener("click", () => refreshSchedules(true));
document.getElementById("token-button").addEventListener("click", () => askToken("enter the API token"));
document.getElementById("token-form").addEventListener("submit", () => {
  sessionStorage.setItem("blackbox-token", document.getElementById("token-input").value);
  refreshAll();
});
refreshAll();
setInterval(refreshAll, REFRESH_MS);
