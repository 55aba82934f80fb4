// The topoplace console: plain script, no build step. It reads the normal API with the
// token given once (kept in sessionStorage, so it goes when the tab does); what it shows
// is what that token may read. Every URL is relative to the page (docs/console.md).
"use strict";

const TOKEN_KEY = "topoplace.token";
const POLL_MS = 1000; // allocations and totals; an allocation shows within a second or two
const NODES_EVERY = 5; // the node list every fifth poll, or at once when allocations change
const LARGE_FLEET = 500; // nodes; past this the list is read every thirtieth poll
const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(new URL(path, document.baseURI), { ...options, headers });
  const text = await response.text();
  if (!response.ok) {
    let code = "error";
    let message = text || response.statusText;
    try {
      const body = JSON.parse(text).error || {};
      code = body.code || code;
      message = body.message || message;
    } catch (ignored) { /* not JSON: say what came */ }
    throw new ApiError(response.status, code, message);
  }
  return options.raw ? text : JSON.parse(text);
}

function explain(error, what) {
  if (!(error instanceof ApiError)) return `${what}: ${error.message}`;
  if (error.status === 401) {
    return `401 unauthorized: ${what} needs an API token. Enter one above (${error.message}).`;
  }
  if (error.status === 403) {
    return `403 forbidden: this token's role may not ${what} (${error.message}).`;
  }
  return `${error.status} ${error.code}: ${error.message}`;
}

function show(id, message) {
  const box = $(id);
  box.textContent = message || "";
  box.hidden = !message;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headings, rows) {
  const head = el("tr", {}, ...headings.map((h) => el("th", {}, h)));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

function ago(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.parse(iso) - Date.now()) / 1000);
  const size = Math.abs(seconds);
  const text = size < 90 ? `${size}s` : size < 5400 ? `${Math.round(size / 60)}m` : `${Math.round(size / 3600)}h`;
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

// ---- state the pieces share -------------------------------------------------
const view = { nodes: [], allocations: [], signature: "", scores: new Map(), node: null };

function design(node) {
  const models = [...new Set(node.gpus.map((g) => g.model))].join(" + ") || "no GPUs";
  return `${node.gpu_count}× ${models}`;
}

function nodeState(node) {
  if (node.state !== "ready") return node.state;
  return node.gpus.some((g) => g.health !== "healthy") ? "degraded" : "ready";
}

// ---- the overview -------------------------------------------------------------
async function loadTotals() {
  const cluster = await api("v1/cluster");
  const held = cluster.gpus.healthy - cluster.gpus.free;
  const cards = [
    ["nodes", cluster.nodes.total],
    ["ready", cluster.nodes.ready],
    ["stale", cluster.nodes.stale],
    ["cordoned", cluster.nodes.cordoned],
    ["GPUs free", `${cluster.gpus.free} / ${cluster.gpus.total}`],
    ["GPUs held", held],
    ["unhealthy GPUs", cluster.gpus.total - cluster.gpus.healthy],
    ["fragmentation", cluster.fragmentation.toFixed(3)],
  ];
  $("totals").replaceChildren(...cards.map(([k, v]) => el("div", { class: "card", "data-total": k }, el("b", {}, v), k)));
}

async function loadNodes() {
  view.nodes = (await api("v1/nodes")).nodes;
  const groups = new Map();
  for (const node of view.nodes) {
    const key = `${design(node)}\u0000${node.region}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(node);
  }
  const rows = [];
  for (const [key, nodes] of [...groups].sort()) {
    const [name, region] = key.split("\u0000");
    const free = nodes.reduce((n, x) => n + x.free_gpus.length, 0);
    const total = nodes.reduce((n, x) => n + x.gpu_count, 0);
    rows.push(el("tr", { class: "design" }, el("th", { colspan: "6" }, `${name} · region ${region} · ${free} of ${total} GPUs free`)));
    for (const node of nodes) {
      const state = nodeState(node);
      const islands = node.islands.map((i) => `${i.name} ${i.free.length}/${i.gpus.length}`).join(", ");
      rows.push(el("tr", { "data-node": node.name },
        el("td", {}, el("a", { href: `#/nodes/${encodeURIComponent(node.name)}` }, node.name)),
        el("td", { class: `state-${state}` }, state),
        el("td", {}, `${node.free_gpus.length} of ${node.gpu_count} free`),
        el("td", {}, islands),
        el("td", {}, node.allocations.length),
        el("td", {}, ago(node.heartbeat_at))));
    }
  }
  $("nodes").replaceChildren(table(["node", "state", "GPUs", "islands (free/size)", "allocations", "heartbeat"], rows));
}

// ---- allocations and decisions -----------------------------------------------
function placedOn(allocation) {
  return allocation.tasks.map((t) => `${t.node}: GPU ${t.gpu_indices.join(",")}`).join("; ");
}

async function loadAllocations() {
  view.allocations = (await api("v1/allocations?limit=200")).allocations;
  const live = view.allocations.filter((a) => ["pending", "active", "degraded"].includes(a.state));
  const rows = live.map((a) => el("tr", { "data-allocation": a.id },
    el("td", { title: a.id }, a.id.slice(0, 8)),
    el("td", {}, a.job_id || ""),
    el("td", {}, a.owner || ""),
    el("td", { class: `state-${a.state}` }, a.state),
    el("td", {}, placedOn(a)),
    el("td", { title: a.expires_at || "" }, a.expires_at ? ago(a.expires_at) : "no expiry")));
  $("allocation-table").replaceChildren(
    rows.length ? table(["id", "job", "owner", "state", "GPUs", "expires"], rows) : el("p", {}, "No live allocations."));
  const recent = view.allocations.slice(0, 20).map((a) => el("li", { "data-allocation": a.id },
    el("b", {}, `${ago(a.created_at)} · ${a.job_id || a.id.slice(0, 8)}${a.owner ? ` (${a.owner})` : ""} · ${a.state}: `),
    a.reason));
  $("decision-list").replaceChildren(...recent);
  const signature = view.allocations.map((a) => `${a.id}:${a.state}`).join("|");
  const changed = signature !== view.signature;
  view.signature = signature;
  return changed;
}

// ---- one node ---------------------------------------------------------------------
function highlight() {
  const svg = $("node-picture").querySelector("svg");
  if (!svg || !view.node) return;
  const given = new Set(view.scores.get(view.node) || []);
  for (const gpu of svg.querySelectorAll("[data-gpu]")) {
    gpu.classList.toggle("whatif", given.has(Number(gpu.dataset.gpu)));
  }
}

async function loadNode(name) {
  let node;
  try {
    node = await api(`v1/nodes/${encodeURIComponent(name)}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      $("node-title").textContent = "No such node";
      $("node-facts").replaceChildren(el("div", { class: "missing", id: "node-missing" },
        `There is no node named "${name}". It may have been removed, or the link is mistyped. `,
        el("a", { href: "#" }, "See the nodes there are.")));
      $("node-picture").replaceChildren();
      return;
    }
    throw error;
  }
  const svgPath = `v1/nodes/${encodeURIComponent(name)}/topology.svg`;
  const svgText = await api(svgPath, { raw: true });
  if (view.node !== name) return; // the reader moved on meanwhile
  $("node-title").textContent = `${node.name} · ${design(node)} · region ${node.region}`;
  const state = nodeState(node);
  $("node-facts").replaceChildren(el("p", {},
    el("span", { class: `state-${state}` }, state), ` · ${node.free_gpus.length} of ${node.gpu_count} GPUs free`,
    ` · reported ${ago(node.reported_at)} · heartbeat ${ago(node.heartbeat_at)}`,
    node.fabric_domain ? ` · fabric ${node.fabric_domain}` : ""));
  const svg = new DOMParser().parseFromString(svgText, "image/svg+xml").documentElement;
  $("node-picture").replaceChildren(document.importNode(svg, true));
  $("node-svg-link").href = svgPath;
  highlight();
}

// ---- what if -------------------------------------------------------------------------
async function score(event) {
  event.preventDefault();
  const form = new FormData(event.target);
  const body = { gpus: Number(form.get("gpus")), tasks: Number(form.get("tasks")), locality: form.get("locality") };
  if (form.get("model")) body.gpu_models = [form.get("model")];
  show("whatif-error", "");
  let result;
  try {
    result = await api("v1/score?limit=50", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  } catch (error) {
    show("whatif-error", explain(error, "score a request (POST /v1/score needs the scheduler or admin role)"));
    $("whatif-results").replaceChildren();
    return;
  }
  view.scores = new Map();
  const counts = new Map(view.nodes.map((n) => [n.name, n]));
  const rows = result.nodes.map((row) => {
    const given = row.task ? row.task.gpu_indices : [];
    if (row.fits) view.scores.set(row.node, given);
    const node = counts.get(row.node);
    const chips = [];
    for (let g = 0; node && g < node.gpu_count; g++) {
      const cls = given.includes(g) ? "chip given" : node.free_gpus.includes(g) ? "chip" : "chip held";
      chips.push(el("span", { class: cls, "data-gpu": g }, g));
    }
    return el("tr", { "data-node": row.node, class: row.fits ? "fits" : "no-fit" },
      el("td", {}, row.rank ?? "–"),
      el("td", {}, el("a", { href: `#/nodes/${encodeURIComponent(row.node)}` }, row.node)),
      el("td", {}, row.fits ? row.score.toFixed(1) : `no: ${row.cause || ""}`),
      el("td", { class: "chips" }, ...chips),
      el("td", {}, row.message));
  });
  $("whatif-results").replaceChildren(rows.length
    ? table(["rank", "node", "score", "GPUs it would give", "why"], rows)
    : el("p", {}, "No node answered."));
  highlight();
}

// ---- wiring it together ------------------------------------------------------------
function route() {
  const match = location.hash.match(/^#\/nodes\/(.+)$/);
  view.node = match ? decodeURIComponent(match[1]) : null;
  $("node-view").hidden = !view.node;
  if (view.node) {
    $("node-title").textContent = view.node;
    $("node-facts").replaceChildren();
    $("node-picture").replaceChildren();
    loadNode(view.node).catch((e) => show("banner", explain(e, "read this node")));
    window.scrollTo(0, 0);
  }
}

let ticks = 0;
let busy = false;
async function poll() {
  if (busy || document.hidden) return;
  busy = true;
  try {
    const changed = await loadAllocations();
    if (view.node && changed) await loadNode(view.node);
    await loadTotals();
    // A large fleet's node list is large: read it less often, and at once on a change.
    const every = view.nodes.length > LARGE_FLEET ? NODES_EVERY * 6 : NODES_EVERY;
    if (changed || ticks % every === 0) await loadNodes();
    show("banner", "");
    $("live").textContent = `live · ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    show("banner", explain(error, "read the cluster"));
    $("live").textContent = "not updating";
  } finally {
    ticks += 1;
    busy = false;
  }
}

function useToken(event) {
  event.preventDefault();
  const value = $("token").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  $("token").value = "";
  restart();
}

function forget() {
  sessionStorage.removeItem(TOKEN_KEY);
  restart();
}

function restart() {
  $("token").placeholder = token() ? "a token is in use (this tab only)" : "tpp_… (kept for this tab only)";
  view.signature = "";
  ticks = 0;
  poll();
  route();
}

$("token-form").addEventListener("submit", useToken);
$("forget").addEventListener("click", forget);
$("whatif-form").addEventListener("submit", score);
window.addEventListener("hashchange", route);
setInterval(poll, POLL_MS);
restart();
