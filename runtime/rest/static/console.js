// The riqr console: plain JavaScript over this server's REST API (docs/api.md), no build step.
// Everything taken from an answer reaches the page through textContent, never as markup.
"use strict";

const TOKEN_KEY = "riqr.token";
const state = {catalog: [], instances: [], selected: null, nextUrl: null, scanUrl: null, page: 0};

const $ = (id) => document.getElementById(id);

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) {
    const td = el("td");
    if (cell instanceof Node) td.append(cell); else td.textContent = cell === undefined || cell === null ? "" : String(cell);
    tr.append(td);
  }
  return tr;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function short(id) {
  return id ? String(id).slice(0, 12) : "";
}

// -- the token -----------------------------------------------------------------------------------------

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function showTokenState() {
  $("token-state").textContent = token() ? "token set (this tab only)" : "no token";
}

// -- calls ---------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function explain(err) {
  if (!(err instanceof ApiError)) return "cannot reach the REST API: " + err.message;
  if (err.status === 401) return "401 Unauthorized (" + err.message + "): paste a valid bearer token above";
  if (err.status === 403) return "403 Forbidden (" + err.message + "): the token may not read this store";
  return err.status + " " + err.code + ": " + err.message;
}

// GET a path relative to the page (so the console works behind a path prefix), with the token.
async function api(path) {
  const headers = {Accept: "application/json"};
  if (token()) headers.Authorization = "Bearer " + token();
  const resp = await fetch(path, {headers, cache: "no-store"});
  let body = null;
  try {
    body = await resp.json();
  } catch (e) {
    body = null;
  }
  if (!resp.ok) {
    const error = (body && body.error) || {};
    throw new ApiError(resp.status, error.code || "error", error.message || resp.statusText);
  }
  return body;
}

// How many columns a user's key has: a window or session store's key adds the window start.
function userColumns(store) {
  const columns = store && store.key && store.key.columns ? store.key.columns.length : 1;
  return store && (store.kind === "window" || store.kind === "session") ? columns - 1 : columns;
}

// A key for a path or a key parameter: a composite key's components are joined by "/", each
// percent-encoded (so a "/" inside a component stays one); a one-column key is encoded whole.
function keyPath(store, text) {
  const parts = userColumns(store) > 1 ? text.split("/") : [text];
  return parts.map(encodeURIComponent).join("/");
}

// A key parameter's value, already encoded by keyPath (query() leaves it as it is).
function keyParam(store, text) {
  return text ? {encoded: keyPath(store, text)} : "";
}

function query(params) {
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  const value = (v) => (typeof v === "object" ? v.encoded : encodeURIComponent(v));
  return pairs.length ? "?" + pairs.map(([k, v]) => k + "=" + value(v)).join("&") : "";
}

// -- the catalog ---------------------------------------------------------------------------------------

// Batches a copy is behind the newest batch its store's sink acknowledged: the facade's figure when the
// catalog has it (lag_batches), else counted from the ingest record.
function lag(position, ingest) {
  if (typeof position.lag_batches === "number") return position.lag_batches;
  if (!ingest || typeof ingest.batch_id !== "number" || typeof position.batch_id !== "number") return null;
  return Math.max(0, ingest.batch_id - position.batch_id);
}

// A copy's lag as shown: batches, and seconds when it is behind ("2 (3.1 s)").
function describeCopyLag(position, ingest) {
  const l = lag(position, ingest);
  if (l === null) return "–";
  const s = position.lag_seconds;
  return l > 0 && typeof s === "number" ? l + " (" + s.toFixed(1) + " s)" : String(l);
}

// Every copy of every partition of a store (the active and its standbys).
function copiesOf(store) {
  return (store.positions || []).flatMap((p) => (p.replicas && p.replicas.length ? p.replicas : [p]));
}

function replicasByNode(storeName) {
  const nodes = new Map();
  for (const inst of state.instances) {
    if (!(inst["state-store-names"] || []).includes(storeName)) continue;
    const entry = nodes.get(inst.node) || {active: [], standby: []};
    entry.active.push(...(inst.partitions || []));
    entry.standby.push(...(inst["standby-partitions"] || []));
    nodes.set(inst.node, entry);
  }
  return nodes;
}

function describeReplicas(storeName) {
  const list = el("ul", null, {class: "plain"});
  for (const [node, parts] of replicasByNode(storeName)) {
    let text = "node " + short(node) + ": " + parts.active.length + " active";
    if (parts.standby.length) text += ", " + parts.standby.length + " standby";
    list.append(el("li", text, {title: node}));
  }
  return list;
}

function describePositions(store) {
  const states = new Map();
  for (const p of store.positions || []) states.set(p.state, (states.get(p.state) || 0) + 1);
  const batches = (store.positions || []).map((p) => p.batch_id).filter((b) => typeof b === "number");
  const parts = [...states].map(([s, n]) => n + " " + s);
  if (batches.length) parts.push("batch " + Math.min(...batches) + (Math.max(...batches) !== Math.min(...batches) ? "–" + Math.max(...batches) : ""));
  return parts.join(", ");
}

function describeLag(store) {
  const copies = copiesOf(store);
  const lags = copies.map((p) => lag(p, store.ingest)).filter((l) => l !== null);
  if (!lags.length) return "–";
  const seconds = copies.map((p) => p.lag_seconds).filter((s) => typeof s === "number");
  const most = Math.max(...lags);
  return "max " + most + " batches" + (most > 0 && seconds.length && Math.max(...seconds) > 0 ? ", " + Math.max(...seconds).toFixed(1) + " s" : "");
}

function describeIngest(ingest) {
  if (!ingest || !ingest.state) return "no sink reported";
  let text = ingest.state;
  if (typeof ingest.batch_id === "number") text += ", batch " + ingest.batch_id;
  if (typeof ingest.at === "number") text += ", " + Math.max(0, Math.round(Date.now() / 1000 - ingest.at)) + " s ago";
  // A windowed store's rows Spark dropped as later than its watermark (docs/operations.md, "Late rows").
  if (typeof ingest.late_rows === "number" && ingest.late_rows > 0) text += ", " + ingest.late_rows + " late rows dropped";
  if (ingest.error) text += ": " + ingest.error;
  else if (ingest.reason) text += ": " + ingest.reason;  // why a feed is stale (no heartbeat)
  if (ingest.catching_up && ingest.catching_up.length) text += "; catching up: " + ingest.catching_up.join(", ");
  return text;
}

function describeDeadLetters(ingest) {
  const letters = (ingest && ingest.dead_letters) || {};
  const entries = Object.entries(letters);
  if (!entries.length) return "-";  // no dead-letter query reports for it (not "0": none found bad)
  return entries.map(([topic, n]) => topic + ": " + n).join(", ");
}

function schema(columns) {
  return (columns || []).map((c) => c.column + " " + c.type).join(", ");
}

function renderCatalog() {
  const body = $("stores").tBodies[0];
  clear(body);
  for (const store of state.catalog) {
    const open = el("button", store.name, {type: "button", class: "link", "data-store": store.name});
    open.addEventListener("click", () => selectStore(store.name));
    const keyColumns = store.key.columns || [{column: store.key.column, type: store.key.type}];
    const tr = row([open, store.kind, schema(keyColumns), schema(store.value),
      store.partitions + (store.standbys ? " (+" + store.standbys + " standby)" : ""),
      describeReplicas(store.name), describePositions(store), describeLag(store),
      describeIngest(store.ingest), describeDeadLetters(store.ingest)]);
    tr.setAttribute("data-store", store.name);
    body.append(tr);
  }
  if (!state.catalog.length) body.append(row(["no stores yet (or none this token may read)"]));
  const select = $("q-store");
  const current = select.value;
  clear(select);
  for (const store of state.catalog) select.append(el("option", store.name, {value: store.name}));
  if (state.catalog.some((s) => s.name === current)) select.value = current;
}

function renderDetail() {
  const store = state.catalog.find((s) => s.name === state.selected);
  $("store-detail").hidden = !store;
  if (!store) return;
  $("detail-name").textContent = store.name;
  const actors = new Map(state.instances.map((i) => [i.actor, i]));
  const body = $("partitions").tBodies[0];
  clear(body);
  for (const p of store.positions || []) {
    // The active copy's row, then one per standby copy (its state, position and lag).
    const standbys = (p.replicas || []).filter((r) => r.role === "standby");
    for (const c of [p, ...standbys]) {
      const inst = actors.get(c.actor) || {};
      const rest = inst.host ? "http://" + inst.host + ":" + inst.port : "";
      const label = c === p ? String(p.partition) : p.partition + " standby";
      const shown = c === p ? c.state : c.state + ", " + c.replica_state;
      const tr = row([label, shown + (c.reason ? " (" + c.reason + ")" : ""), c.batch_id, describeCopyLag(c, store.ingest),
        c.source, el("span", short(c.actor), {title: c.actor || ""}), el("span", short(inst.node || c.node), {title: inst.node || c.node || ""}), rest]);
      tr.setAttribute(c === p ? "data-partition" : "data-standby-of", String(p.partition));
      body.append(tr);
    }
  }
}

async function refresh() {
  try {
    const [stores, metadata] = await Promise.all([api("stores"), api("metadata")]);
    state.catalog = stores.result;
    state.instances = metadata.result;
    renderCatalog();
    renderDetail();
    setStatus("");
  } catch (err) {
    state.catalog = [];
    state.instances = [];
    renderCatalog();
    renderDetail();
    setStatus(explain(err), true);
  }
}

function setStatus(text, isError) {
  const status = $("status");
  status.textContent = text;
  status.className = isError ? "error" : "";
}

function selectStore(name) {
  state.selected = name;
  $("q-store").value = name;
  renderDetail();
}

// -- queries -------------------------------------------------------------------------------------------

function showFields() {
  const op = $("q-op").value;
  for (const label of document.querySelectorAll("#query label[data-for]")) {
    label.hidden = !label.getAttribute("data-for").split(" ").includes(op);
  }
  // A window's two times bound its start; a session's are Kafka's findSessions bounds (earliestEnd,
  // latestStart), not a range of starts.
  const sessions = op === "sessions";
  $("q-tfrom-label").textContent = sessions ? "ends at or after" : "starts from";
  $("q-tto-label").textContent = sessions ? "starts at or before" : "starts until";
}

function queryUrl() {
  const store = state.catalog.find((s) => s.name === $("q-store").value);
  if (!store) throw new Error("choose a store");
  const base = "stores/" + encodeURIComponent(store.name);
  const op = $("q-op").value;
  const key = $("q-key").value, from = $("q-from").value, to = $("q-to").value;
  const tfrom = $("q-tfrom").value, tto = $("q-tto").value;
  const paging = {limit: $("q-limit").value, reverse: $("q-reverse").checked ? "true" : ""};
  switch (op) {
    case "get": return base + "/get/" + keyPath(store, key);
    case "all": return base + "/all" + query(paging);
    case "range": return base + "/range" + query({from: keyParam(store, from), to: keyParam(store, to), ...paging});
    case "prefix": return base + "/prefix/" + encodeURIComponent(key) + query(paging);
    case "windows":
      if (key) return base + "/windows/" + keyPath(store, key) + query({from: tfrom, to: tto, ...paging});
      return base + "/windows" + query({keyFrom: keyParam(store, from), keyTo: keyParam(store, to), from: tfrom, to: tto, ...paging});
    case "sessions":
      if (key) return base + "/sessions/" + keyPath(store, key) + query({earliestEnd: tfrom, latestStart: tto, ...paging});
      return base + "/sessions" + query({keyFrom: keyParam(store, from), keyTo: keyParam(store, to), earliestEnd: tfrom, latestStart: tto, ...paging});
    default: throw new Error("unknown query " + op);
  }
}

function showEntries(entries) {
  const body = $("q-results").tBodies[0];
  clear(body);
  for (const entry of entries) {
    const window = entry.window ? entry.window.start + " – " + entry.window.end : "";
    body.append(row([JSON.stringify(entry.key), window, JSON.stringify(entry.value)]));
  }
}

async function run(url, page) {
  $("q-url").textContent = "GET " + url;
  $("q-next").disabled = true;
  state.nextUrl = null;
  $("q-status").className = "";
  $("q-status").textContent = "asking ...";
  try {
    const body = await api(url);
    if ("response" in body) {
      showEntries([{key: $("q-key").value, value: body.response}]);
      $("q-status").textContent = "found";
      return;
    }
    showEntries(body.result);
    const shown = body.result.length;
    if (body.next) {
      // The next page repeats the scan as it began (its path, bounds, direction and limit) with the cursor:
      // the server takes a cursor alone or with the parameters that began its scan, and a prefix or key
      // in the path is one of them.
      const scan = state.scanUrl;
      state.nextUrl = scan + (scan.includes("?") ? "&" : "?") + "cursor=" + encodeURIComponent(body.next);
      $("q-next").disabled = false;
    }
    const paged = body.next !== undefined ? "page " + page + ": " : "";
    $("q-status").textContent = paged + shown + " entries" + (body.next ? "; more: Next page" : "; end of the scan");
  } catch (err) {
    clear($("q-results").tBodies[0]);
    $("q-status").textContent = explain(err);
    $("q-status").className = "error";
  }
}

// -- where a key lives ---------------------------------------------------------------------------------

async function locate() {
  const store = state.catalog.find((s) => s.name === $("q-store").value);
  const out = $("m-result");
  clear(out);
  $("m-status").className = "";
  if (!store) {
    $("m-status").textContent = "choose a store in the query panel";
    return;
  }
  try {
    const body = await api("metadata/stores/" + encodeURIComponent(store.name) + "/key/" + keyPath(store, $("m-key").value));
    const owner = body.result;
    const standbys = (owner.standbys || []).map((s) => short(s.actor) + " on node " + short(s.node)).join(", ");
    const facts = [
      ["store", store.name], ["partition", owner.partition], ["actor", owner.actor], ["node", owner.node],
      ["REST endpoint", owner.host ? "http://" + owner.host + ":" + owner.port : "–"],
      ["standbys", standbys || "none"],
    ];
    for (const [name, value] of facts) {
      out.append(el("dt", name), el("dd", value, {"data-fact": name}));
    }
    $("m-status").textContent = "";
  } catch (err) {
    $("m-status").textContent = explain(err);
    $("m-status").className = "error";
  }
}

// -- wiring --------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    showTokenState();
    refresh();
  });
  $("clear-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenState();
    refresh();
  });
  $("refresh").addEventListener("click", refresh);
  $("q-op").addEventListener("change", showFields);
  $("q-store").addEventListener("change", () => selectStore($("q-store").value));
  $("query").addEventListener("submit", (event) => {
    event.preventDefault();
    let url;
    try {
      url = queryUrl();
    } catch (err) {
      $("q-status").textContent = err.message;
      return;
    }
    state.page = 1;
    state.scanUrl = url;
    run(url, state.page);
  });
  $("q-next").addEventListener("click", () => {
    if (state.nextUrl) run(state.nextUrl, ++state.page);
  });
  $("locate").addEventListener("submit", (event) => {
    event.preventDefault();
    locate();
  });
  showTokenState();
  showFields();
  refresh();
});
