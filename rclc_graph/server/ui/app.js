// rclc-graph live view: list runs, start one from a topology, watch it live.
// Every string from a run (outputs, prompts, tokens, names) reaches the page through
// textContent, never as HTML; the only markup inserted is the server-rendered graph SVG.
"use strict";

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("rclc-token") || "";
let topologies = [];
let view = null; // the run on screen: {id, status, nodes, kinds, kept, lastId, controller, colours, shown}

// One status vocabulary for a run, the same words in the run list and the run view (the
// server's: GET /runs/{id} `status`); the title says what each means.
const RUN_STATUS = {
  queued: "admitted; waits for a free slot",
  starting: "loading models; no node has started yet",
  running: "its nodes are running",
  waiting: "waits for a person's answer (the banner above asks)",
  finished: "every node finished",
  failed: "a node failed; fix the cause, then resume it",
  cancelled: "cancelled; the nodes that finished are recorded",
  interrupted: "the server stopped while it ran; resume it",
};

function paintBadge(element, status) {
  element.textContent = status;
  element.className = "badge " + status;
  element.title = RUN_STATUS[status] || "";
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token) headers["Authorization"] = "Bearer " + token;
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(options.json);
  }
  const response = await fetch(path, Object.assign({}, options, {headers}));
  if (response.status === 401) $("token-form").hidden = false;
  return response;
}

function describeError(body) {
  const error = (body && body.error) || {message: "request failed"};
  const lines = [error.message];
  if (error.fix) lines.push("fix: " + error.fix);
  for (const problem of error.problems || []) {
    if (problem.message && !error.message.includes(problem.message)) lines.push(`${problem.code}: ${problem.message} (fix: ${problem.fix})`);
  }
  return lines.join("\n");
}

// -- new runs ---------------------------------------------------------------------------

async function loadTopologies() {
  const response = await api("/topologies");
  if (!response.ok) return;
  topologies = (await response.json()).topologies.filter((item) => item.valid);
  const select = $("topology");
  select.replaceChildren(...topologies.map((item) => el("option", {value: item.name, text: item.name})));
  const preferred = topologies.find((item) => item.example_inputs) || topologies[0];
  if (preferred) select.value = preferred.name;
  buildInputs();
}

function buildInputs() {
  const topology = topologies.find((item) => item.name === $("topology").value);
  const box = $("inputs");
  box.replaceChildren();
  if (!topology) return;
  $("topology-description").textContent = topology.description || "";
  previewGraph(topology.name);
  const example = topology.example_inputs || {};
  for (const [name, spec] of Object.entries(topology.inputs || {})) {
    const isList = spec.type === "list[str]";
    let value = example[name] !== undefined ? example[name] : spec.default;
    if (isList && Array.isArray(value)) value = value.join("\n");
    const area = el("textarea", {name, "data-list": isList ? "1" : "0", rows: isList ? "5" : "2"});
    area.value = value || "";
    const hint = [spec.type, isList ? "one item per line" : "", spec.description].filter(Boolean).join(" · ");
    box.append(el("label", {class: "field"}, name + " ", el("small", {text: hint}), area));
  }
}

// The topology drawn before any run starts (GET /topologies/{name}/graph.svg), so people see
// what they are about to run. Server-rendered SVG: every label is escaped there.
async function previewGraph(name) {
  const box = $("topology-graph");
  box.dataset.topology = name;
  const response = await api(`/topologies/${encodeURIComponent(name)}/graph.svg`);
  if (box.dataset.topology !== name) return; // another topology was chosen meanwhile
  box.innerHTML = response.ok ? await response.text() : "";
}

async function startRun(event) {
  event.preventDefault();
  const inputs = {};
  for (const area of $("inputs").querySelectorAll("textarea")) {
    inputs[area.name] = area.dataset.list === "1" ? area.value.split("\n").map((line) => line.trim()).filter(Boolean) : area.value;
  }
  const body = {topology: $("topology").value, inputs, seed: Number($("seed").value || 0)};
  const box = $("form-error");
  box.hidden = true;
  const response = await api("/runs", {method: "POST", json: body});
  const data = await response.json();
  if (response.status !== 202) {
    box.textContent = describeError(data);
    box.hidden = false;
    return;
  }
  await refreshRuns();
  selectRun(data.run_id);
}

// -- the run list ------------------------------------------------------------------------

let listingsAsked = 0, listingShown = 0; // refreshRuns' listings in the order asked: the newest shown wins

async function refreshRuns() {
  // The listing answers for the moment it was asked. If the view's status changed while it was
  // on its way (the run's end event came first), its word is older than the view's: acting on
  // it would reselect a finished run (clearing its cards) or paint an old status back.
  const asked = view, changesAsked = view ? view.statusChanges : 0;
  const asking = ++listingsAsked;
  const [runs, state] = await Promise.all([api("/runs?limit=100"), api("/server")]);
  if (asking < listingShown) return; // a newer listing is already on the page: this one is older news
  listingShown = asking;
  if (state.ok) {
    const s = await state.json();
    $("server-state").textContent = `${s.active} running (max ${s.max_concurrent}), ${s.queued} queued`;
  }
  if (!runs.ok) return;
  const list = $("run-list");
  list.replaceChildren(...(await runs.json()).runs.map((run) => {
    const shown = view && view.id === run.run_id;
    const current = shown && view === asked && view.statusChanges === changesAsked;
    // the run on screen: one word in both places. While its events stream, they are the newest
    // news; otherwise the server's status is (when no newer word came meanwhile), and the view takes it.
    if (current && !view.following && view.status && run.status !== view.status) {
      // resumed or answered elsewhere (another tab, the CLI): follow the new attempt, else take the word
      if (["queued", "starting", "running"].includes(run.status)) selectRun(run.run_id);
      else setStatus(run.status);
    }
    const status = shown && view.status ? view.status : run.status;
    const badge = el("span", {});
    paintBadge(badge, status);
    const item = el("li", {"data-run": run.run_id, class: shown ? "selected" : ""},
      el("div", {}, el("div", {text: run.graph || "(run)"}), el("div", {class: "rid mono", text: run.run_id})), badge);
    item.addEventListener("click", () => selectRun(run.run_id));
    return item;
  }));
}

// -- one run, live -----------------------------------------------------------------------

function setStatus(status) {
  view.status = status;
  view.statusChanges += 1;
  paintBadge($("run-status"), status);
  for (const item of $("run-list").children) {
    const badge = item.querySelector(".badge");
    if (item.dataset.run === view.id && badge) paintBadge(badge, status);
  }
  $("run-cancel").hidden = !["queued", "starting", "running"].includes(status);
  $("run-resume").hidden = !["interrupted", "cancelled", "failed"].includes(status);
}

async function selectRun(runId) {
  if (view && view.controller) view.controller.abort();
  view = {id: runId, status: null, nodes: {}, kinds: {}, kept: {}, edges: {}, lastId: 0, controller: new AbortController(),
    colours: {}, order: [], shown: {}, following: true, scopes: {}, statusChanges: 0};
  // following: its events stream (until their end); statusChanges: how often its status was set (refreshRuns)
  $("placeholder").hidden = true;
  $("run").hidden = false;
  $("run-id").textContent = runId;
  $("run-title").textContent = "";
  $("run-error").hidden = true;
  $("outputs").replaceChildren();
  $("nodes").replaceChildren();
  $("graph").replaceChildren();
  $("run-report").hidden = true;
  $("waiting-items").replaceChildren();
  $("waiting-banner").hidden = true;
  for (const item of $("run-list").children) item.classList.toggle("selected", item.dataset.run === runId);
  // Another selectRun may start while this one waits (a click, the run list): from then on
  // this one must not touch the page, or it would follow the new view a second time and
  // every event would show twice.
  const current = view;
  const response = await api(`/runs/${encodeURIComponent(runId)}`);
  if (!response.ok || current !== view) return;
  const run = await response.json();
  if (current !== view) return;
  setStatus(run.status);
  showError(run);
  showReport(run);
  if (run.record) {
    $("run-title").textContent = run.record.graph;
    learnPlan(run.record);
    view.order = run.record.plan.nodes.map((node) => node.name);
    // a subgraph's nodes (scope) and run-time foreach copies (foreach_from) say so on their cards
    for (const node of run.record.plan.nodes) view.scopes[node.name] = {scope: node.scope || "", from: node.foreach_from || ""};
    view.order.forEach((name, index) => { view.colours[name] = PALETTE[index % PALETTE.length]; card(name); });
  }
  await drawGraph();
  if (current === view) follow(current);
}

// What the record says about the plan's nodes (function or agent) and the people it waits for.
function learnPlan(record) {
  for (const node of record.plan.nodes || []) {
    view.kinds[node.name] = node.call ? "function" : "agent";
    if (node.call && view.nodes[node.name]) asFunction(view.nodes[node.name]);
  }
  for (const item of record.waiting || []) view.shown[item.node] = item.shown || {};
  for (const node of Object.keys(view.shown)) showWhatWasShown(node);
}

async function learnRun(current) {
  const response = await api(`/runs/${encodeURIComponent(current.id)}`);
  if (!response.ok || current !== view) return;
  const run = await response.json();
  if (run.record) learnPlan(run.record);
}

function showError(run) {
  // why the run, or its last resume or answer, failed (text, never HTML)
  if (!run.error) return;
  $("run-error").textContent = run.error;
  $("run-error").hidden = false;
}

async function drawGraph() {
  const current = view;
  const response = await api(`/runs/${encodeURIComponent(current.id)}/graph.svg`);
  if (!response.ok || current !== view) return;
  $("graph").innerHTML = await response.text(); // server-rendered SVG: every label escaped there
  // the drawing colours nodes by their order in it, as the report does: the cards follow
  $("graph").querySelectorAll("g.node").forEach((group, index) => {
    current.colours[group.dataset.node] = PALETTE[index % PALETTE.length];
  });
  for (const [name, node] of Object.entries(current.nodes)) {
    paintNode(name, node.status);
    node.parts.dot.style.color = current.colours[name] || "#999";
    renderLineage(node);
  }
  paintEdges();
}

function showReport(run) {
  const link = $("run-report");
  if (run.links && run.links.report) {
    link.href = run.links.report;
    link.hidden = false;
  }
}

function paintNode(name, status) {
  for (const group of $("graph").querySelectorAll("g.node")) {
    if (group.dataset.node === name) group.setAttribute("class", "node " + status);
  }
}

function card(name) {
  if (view.nodes[name]) return view.nodes[name];
  const colour = view.colours[name] || PALETTE[Object.keys(view.nodes).length % PALETTE.length];
  const parts = {
    dot: el("span", {style: `color:${colour}`, text: "● "}),
    status: el("span", {class: "badge", text: "pending"}),
    facts: el("div", {class: "facts"}),
    hops: el("ul", {class: "hops"}),
    tokens: el("div", {class: "tokens"}),
    lineage: el("div", {class: "small"}),
    prompt: el("div", {class: "prompt"}),
  };
  // a subgraph's node is named "subgraph/node" (nested: "a/b/node"), so its name says where it is
  const where = view.scopes[name] || {scope: name.includes("/") ? name.slice(0, name.lastIndexOf("/")) : ""};
  const notes = [where.scope ? `in subgraph ${where.scope}` : "", where.from ? `an item of ${where.from}'s list` : ""]
    .filter(Boolean).join(", ");
  const title = el("h3", {}, el("span", {}, parts.dot, name), notes ? el("span", {class: "scope", text: notes}) : "",
    parts.status);
  parts.details = el("details", {}, el("summary", {text: "prompt (kept spans highlighted)"}), parts.prompt);
  const box = el("div", {class: "card", "data-node": name}, title, parts.facts, parts.hops, parts.tokens, parts.lineage,
    parts.details);
  $("nodes").append(box);
  view.nodes[name] = {box, parts, status: "pending", tokens: [], info: null, lineage: null, opened: false, kind: "agent"};
  if (view.kinds[name] === "function") asFunction(view.nodes[name]);
  return view.nodes[name];
}

// A function node has no prompt and no model state: its card shows what it received and
// returned, without the prompt toggle and the lineage bar an agent's card has.
function asFunction(node) {
  if (node.kind === "function") return;
  node.kind = "function";
  node.box.classList.add("function");
  node.parts.details.remove();
  node.parts.lineage.remove();
  node.lineage = null;
}

function nodeStatus(name, status) {
  const node = card(name);
  node.status = status;
  node.parts.status.textContent = status;
  node.parts.status.className = "badge " + status;
  node.box.className = "card " + status + (node.kind === "function" ? " function" : "");
  paintNode(name, status);
  if (status !== "waiting") dropQuestion(name);
}

// A node that waits for a person: its question, what it shows them, and a box for the answer,
// in the banner at the top of the run view (not inside the node's card, below the fold). The
// Answer button sends every filled box at once (POST /runs/{id}/answer).
function waiting(event) {
  nodeStatus(event.node, "waiting");
  const node = card(event.node);
  if (node.info) node.finishedFacts = node.parts.facts.textContent; // interrupt after: it ran
  node.parts.facts.textContent = "waiting: " + event.question;
  const items = $("waiting-items");
  if (!items.querySelector(`.ask[data-node="${CSS.escape(event.node)}"]`)) {
    const box = el("textarea", {name: "answer", "data-node": event.node, rows: "3", placeholder: `your answer for ${event.node}`});
    items.append(el("div", {class: "ask", "data-node": event.node},
      el("div", {class: "question"}, el("strong", {text: event.node}), ": ", event.question),
      el("div", {class: "shown"}), box));
    showWhatWasShown(event.node);
  }
  $("waiting-banner").hidden = false;
}

function showWhatWasShown(name) {
  const item = $("waiting-items").querySelector(`.ask[data-node="${CSS.escape(name)}"]`);
  const shown = view.shown[name];
  if (!item || !shown) return;
  item.querySelector(".shown").textContent = Object.entries(shown).map(([sender, text]) => `${sender}: ${text}`).join("\n\n");
}

function dropQuestion(name) {
  const item = $("waiting-items").querySelector(`.ask[data-node="${CSS.escape(name)}"]`);
  if (item) item.remove();
  if (!$("waiting-items").children.length) $("waiting-banner").hidden = true;
}

// An edge's state (fired, idle: a condition that did not hold, delivered), kept so a graph
// drawn after the event (it loads while events arrive) shows it too.
function markEdge(source, target, state) {
  view.edges[source + "\u0000" + target] = state;
  paintEdges();
}

function paintEdges() {
  for (const group of $("graph").querySelectorAll("g.edge")) {
    const state = view.edges[group.dataset.source + "\u0000" + group.dataset.target];
    if (state) group.setAttribute("class", "edge " + state);
  }
}

function decided(event) {
  markEdge(event.source, event.target, event.fired ? "fired" : "idle");
}

function handle(event) {
  switch (event.type) {
    case "run.started":
      setStatus("running");
      learnRun(view); // the record exists now: which nodes are functions
      // a new attempt starts only once people answered: a node that waited after it finished
      // is finished, one that waited before it ran is pending again (it asks again if unanswered)
      for (const [name, node] of Object.entries(view.nodes)) {
        if (node.status !== "waiting") continue;
        nodeStatus(name, node.info ? "finished" : "pending");
        node.parts.facts.textContent = node.info ? node.finishedFacts || "" : "";
      }
      view.shown = {};
      $("run-title").textContent = event.plan;
      drawGraph();
      break;
    case "node.started": nodeStatus(event.node, "running"); break;
    case "hop.delivered": hop(event); break;
    case "token": {
      const node = card(event.node);
      const span = el("span", {"data-index": String(event.index), text: event.text});
      node.tokens[event.index] = span;
      node.parts.tokens.append(span);
      node.parts.tokens.scrollTop = node.parts.tokens.scrollHeight;
      break;
    }
    case "node.finished": finished(event); break;
    case "node.skipped": nodeStatus(event.node, "skipped"); card(event.node).parts.facts.textContent = event.reason; break;
    case "node.waiting": waiting(event); break;
    case "edge.decided": decided(event); break;
    case "node.failed":
      if (event.node) { nodeStatus(event.node, "failed"); card(event.node).parts.facts.textContent = event.message; }
      break;
    case "tool.call": case "tool.result": {
      const line = event.type === "tool.call" ? `tool ${event.name}(${JSON.stringify(event.arguments)})`
        : `→ ${event.error ? "error: " + event.error : JSON.stringify(event.result)}`;
      card(event.node).parts.hops.append(el("li", {text: line}));
      break;
    }
    case "run.finished": case "run.failed": case "run.cancelled": case "run.waiting":
      ended(event);
      break;
  }
}

function hop(event) {
  const node = card(event.target);
  const text = event.mode === "text" ? `← text from ${event.source} (${event.payload_bytes} bytes)`
    : `← ${event.source}: kept ${event.kept_positions}/${event.total_positions} (${event.policy}), `
      + `${event.payload_bytes} bytes, selection ${event.selection_seconds.toFixed(3)} s`;
  node.parts.hops.append(el("li", {text}));
  for (const [origin, kind, hops, start, length] of event.kept || []) {
    (view.kept[origin] = view.kept[origin] || []).push({kind, start, length, target: event.target});
    highlight(origin);
  }
  markEdge(event.source, event.target, "fired delivered");
}

function keptBy(origin, position, kind) {
  return (view.kept[origin] || []).filter((seg) => seg.kind === kind && position >= seg.start && position < seg.start + seg.length);
}

function highlight(name) {
  const node = view.nodes[name];
  if (!node || !node.info) return;
  const first = node.info.positions - node.info.generated_tokens;
  node.tokens.forEach((span, index) => {
    const by = keptBy(name, first + index, "token");
    if (by.length) { span.classList.add("kept"); span.title = "kept into " + [...new Set(by.map((seg) => seg.target))].join(", "); }
  });
  let marked = 0;
  for (const span of node.parts.prompt.querySelectorAll("span[data-position]")) {
    const by = keptBy(name, Number(span.dataset.position), "prompt");
    if (by.length) {
      span.classList.add("kept");
      span.title = "kept into " + [...new Set(by.map((seg) => seg.target))].join(", ");
      marked += 1;
    }
  }
  if (marked && !node.opened && node.kind !== "function") { node.opened = true; node.parts.details.open = true; } // once
}

async function finished(event) {
  nodeStatus(event.node, "finished");
  const node = card(event.node);
  node.info = {positions: event.positions, generated_tokens: event.generated_tokens};
  if (node.kind === "function") {
    node.parts.facts.textContent = `function: returned ${(event.text || "").length} characters of text`;
  } else {
    node.parts.facts.textContent = `${event.positions} positions (${event.inherited_positions} inherited), `
      + `${event.generated_tokens} tokens generated in ${Number(event.generation_seconds).toFixed(2)} s`;
    node.lineage = (event.lineage && event.lineage.by_node) || {};
    renderLineage(node);
  }
  if (!node.tokens.length && event.text) node.parts.tokens.textContent = event.text; // functions, vLLM: no token events
  const current = view;
  const response = await api(`/runs/${encodeURIComponent(current.id)}/nodes/${encodeURIComponent(event.node)}`);
  if (response.ok && current === view) {
    const data = await response.json();
    if (data.kind === "function") asFunction(node);
    else showPrompt(node, data);
  }
  drawGraph();
}

function renderLineage(node) {
  if (!node.lineage || node.kind === "function") return;
  const byNode = node.lineage;
  const total = Object.values(byNode).reduce((a, b) => a + b, 0) || 1;
  const bar = el("div", {class: "bar"});
  for (const [origin, count] of Object.entries(byNode)) {
    bar.append(el("span", {style: `width:${(100 * count / total).toFixed(2)}%;background:${view.colours[origin] || "#999"}`, title: `${origin}: ${count}`}));
  }
  node.parts.lineage.replaceChildren(el("div", {text: "lineage: " + Object.entries(byNode).map(([o, c]) => `${o} ${c}`).join(", ")}), bar);
}

function showPrompt(node, data) {
  const text = data.prompt_text || "";
  const pieces = [];
  let cursor = 0;
  data.prompt_offsets.forEach(([start, end], index) => {
    if (start >= 8000) return;
    if (start > cursor) pieces.push(document.createTextNode(text.slice(cursor, start)));
    const from = Math.max(start, cursor);
    if (end > from) pieces.push(el("span", {"data-position": String(data.prompt_start + index), text: text.slice(from, end)}));
    cursor = Math.max(cursor, end);
  });
  if (cursor < Math.min(text.length, 8000)) pieces.push(document.createTextNode(text.slice(cursor, 8000)));
  node.parts.prompt.replaceChildren(...pieces);
  highlight(data.node);
}

function ended(event) {
  const status = event.type.split(".")[1];
  setStatus(status);
  if (event.outputs) {
    $("outputs").replaceChildren(...Object.entries(event.outputs).map(([name, text]) =>
      el("div", {class: "output"}, el("div", {class: "label", text: name}), el("div", {class: "text", text}))));
  }
  if (event.error) { $("run-error").textContent = event.error; $("run-error").hidden = false; }
  for (const [name, node] of Object.entries(view.nodes)) if (node.status === "running") nodeStatus(name, status === "cancelled" ? "cancelled" : "failed");
  refreshRuns();
}

// Server-Sent Events over fetch (EventSource cannot send the Authorization header), resumed
// with Last-Event-ID after a dropped connection.
async function follow(current) {
  current.following = true;
  while (current === view) {
    try {
      const headers = current.lastId ? {"Last-Event-ID": String(current.lastId)} : {};
      const response = await api(`/runs/${encodeURIComponent(current.id)}/events`, {headers, signal: current.controller.signal});
      if (!response.ok) return;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let split;
        while ((split = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, split);
          buffer = buffer.slice(split + 2);
          const fields = {};
          for (const line of block.split("\n")) {
            const colon = line.indexOf(":");
            if (colon > 0) fields[line.slice(0, colon)] = line.slice(colon + 1).replace(/^ /, "");
          }
          if (fields.event === "end") {
            const end = JSON.parse(fields.data);
            current.following = false;
            if (current !== view) return;
            setStatus(end.status);
            refreshRuns();
            const again = await api(`/runs/${encodeURIComponent(current.id)}`);
            if (again.ok && current === view) {
              const run = await again.json();
              showError(run);
              showReport(run);
              if (run.record) learnPlan(run.record); // what a waiting run shows the person
            }
            return;
          }
          if (fields.data && fields.id) {
            current.lastId = Number(fields.id);
            handle(JSON.parse(fields.data));
          }
        }
      }
    } catch (error) {
      if (current.controller.signal.aborted) { current.following = false; return; }
    }
    await new Promise((resolve) => setTimeout(resolve, 1000)); // reconnect, continuing after lastId
  }
}

async function cancelRun() {
  await api(`/runs/${encodeURIComponent(view.id)}/cancel`, {method: "POST"});
}

async function answerRun(event) {
  if (event) event.preventDefault();
  const answers = {};
  for (const box of $("waiting-items").querySelectorAll("textarea")) {
    if (box.value.trim()) answers[box.dataset.node] = box.value;
  }
  if (!Object.keys(answers).length) return;
  const current = view; // another run may be selected while the answer is on its way
  const response = await api(`/runs/${encodeURIComponent(current.id)}/answer`, {method: "POST", json: {answers}});
  if (current !== view) return;
  if (response.status !== 202) {
    $("run-error").textContent = describeError(await response.json());
    $("run-error").hidden = false;
    return;
  }
  selectRun(current.id);
}

async function resumeRun() {
  const current = view;
  const response = await api(`/runs/${encodeURIComponent(current.id)}/resume`, {method: "POST"});
  if (current !== view) return;
  if (response.status !== 202) {
    $("run-error").textContent = describeError(await response.json());
    $("run-error").hidden = false;
    return;
  }
  selectRun(current.id);
}

document.addEventListener("DOMContentLoaded", () => {
  $("topology").addEventListener("change", buildInputs);
  $("start-form").addEventListener("submit", startRun);
  $("run-cancel").addEventListener("click", cancelRun);
  $("run-resume").addEventListener("click", resumeRun);
  $("answer-form").addEventListener("submit", answerRun);
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("token").value.trim();
    sessionStorage.setItem("rclc-token", token);
    $("token-form").hidden = true;
    loadTopologies();
    refreshRuns();
  });
  loadTopologies();
  refreshRuns();
  setInterval(refreshRuns, 3000);
});
