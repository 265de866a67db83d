// The cellscale admin page: reads /api/admin/tenancy and /api/admin/audit, edits quotas
// and weights with PUTs. Text goes in with textContent only: nothing is parsed as HTML.
"use strict";
const PREFIX = document.body.dataset.prefix;
// The page's anti-CSRF token: the control plane refuses a change signed in by the cookie without it.
const CSRF = document.querySelector('meta[name="cellscale-csrf"]').content;
const api = (path, { headers = {}, ...options } = {}) =>
  fetch(`${PREFIX}/api/admin/${path}`,
    { credentials: "same-origin", headers: { "X-CSRF-Token": CSRF, ...headers }, ...options }).then(async (r) => {
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(explain(body.detail) || `${r.status} ${r.statusText}`);
    return body;
  });

// An error's detail: our own refusals are a string; FastAPI's request validation (a body
// that doesn't parse as a quota, e.g. a lending limit above nominal) is a list of errors.
function explain(detail) {
  if (!Array.isArray(detail)) return detail ? String(detail) : "";
  return detail.map((e) => {
    const where = (e.loc || []).filter((part) => part !== "body").join(".");
    const message = String(e.msg || "invalid").replace(/^Value error, /, "");
    return where ? `${where}: ${message}` : message;
  }).join("; ");
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function show(id, message) {
  const box = document.getElementById(id);
  box.textContent = message || "";
  box.hidden = !message;
}

function numberInput(label, value, allowEmpty) {
  return el("input", { type: "number", min: "0", step: "1", "aria-label": label,
    value: value === null || value === undefined ? "" : String(value), placeholder: allowEmpty ? "none" : "" });
}

function bar(used, nominal, borrowed, scale) {
  const width = 160, height = 14, px = (n) => (scale ? (n / scale) * width : 0);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "bar");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${used} used of ${nominal} nominal, ${borrowed} borrowed`);
  const rect = (x, w, fill) => {
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    Object.entries({ x, y: 0, width: Math.max(0, w), height, fill }).forEach(([k, v]) => r.setAttribute(k, v));
    svg.append(r);
  };
  rect(0, width, "var(--bar-track)");
  rect(0, px(nominal), "var(--bar-nominal)");
  rect(0, px(used - borrowed), "var(--bar-used)");
  rect(px(used - borrowed), px(borrowed), "var(--bar-borrowed)");
  return svg;
}

async function save(path, body, what) {
  show("error", "");
  try {
    await api(path, { method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    show("notice", `saved: ${what}`);
    await load();
  } catch (err) {
    show("notice", "");
    show("error", `not saved (${what}): ${err.message}`);
  }
}

function weightEditor(kind, name, weight) {
  const input = el("input", { type: "number", min: "0.01", step: "0.1", value: String(weight),
    "aria-label": `weight of ${name}` });
  const button = el("button", { type: "button", text: "set weight", "aria-label": `set weight of ${name}`,
    onclick: () => save(`${kind}/${encodeURIComponent(name)}/weight`, { weight: Number(input.value) }, `weight of ${name}`) });
  return el("span", {}, " weight ", input, " ", button);
}

function renderTree(doc) {
  const children = {};
  for (const [name, c] of Object.entries(doc.cohorts)) (children[c.parent || ""] ||= []).push(["cohort", name, c]);
  for (const [name, q] of Object.entries(doc.cluster_queues)) (children[q.cohort || ""] ||= []).push(["cq", name, q]);
  const tenantsOf = {};
  for (const [tenant, t] of Object.entries(doc.tenants))
    for (const [queue, lq] of Object.entries(t.queues)) (tenantsOf[lq.cluster_queue] ||= []).push(`${tenant}/${queue}`);
  const list = (parent) => {
    const ul = el("ul");
    for (const [kind, name, item] of children[parent] || []) {
      const label = kind === "cohort" ? `cohort ${name}` : `cluster queue ${name}`;
      const li = el("li", { "data-node": `${kind}:${name}` }, el("strong", { text: label }),
        weightEditor(kind === "cohort" ? "cohorts" : "cluster-queues", name, item.weight));
      if (kind === "cq") li.append(el("span", { class: "muted", text: ` ← tenants: ${(tenantsOf[name] || []).join(", ") || "none"}` }));
      else li.append(list(name));
      ul.append(li);
    }
    return ul;
  };
  document.getElementById("tree").replaceChildren(list(""));
}

function renderQuotas(view) {
  const rows = [];
  // each flavor is its own pool of GPUs: its bars share a scale (its capacity), not the largest pool's
  const scale = {};
  for (const f of view.flavors) scale[f.flavor] = Math.max(1, f.capacity_gpus || f.nominal_total);
  for (const usage of view.usage)
    for (const f of usage.flavors) scale[f.flavor] = Math.max(scale[f.flavor] || 1, f.nominal, f.used);
  for (const usage of view.usage) {
    for (const f of usage.flavors) {
      const nominal = numberInput(`nominal ${usage.cluster_queue} ${f.flavor}`, f.nominal, false);
      const borrowing = numberInput(`borrowing limit ${usage.cluster_queue} ${f.flavor}`, f.borrowing_limit, true);
      const lending = numberInput(`lending limit ${usage.cluster_queue} ${f.flavor}`, f.lending_limit, true);
      const value = (input) => (input.value === "" ? null : Number(input.value));
      const button = el("button", { type: "button", text: "save",
        "aria-label": `save ${usage.cluster_queue} ${f.flavor} quota`,
        onclick: () => save(`cluster-queues/${encodeURIComponent(usage.cluster_queue)}/quotas/${encodeURIComponent(f.flavor)}`,
          { nominal: value(nominal), borrowing_limit: value(borrowing), lending_limit: value(lending) },
          `${usage.cluster_queue} ${f.flavor} quota`) });
      rows.push(el("tr", { "data-queue": usage.cluster_queue, "data-flavor": f.flavor },
        el("td", { text: usage.cluster_queue }), el("td", { text: `${f.flavor} (${f.backend})` }),
        el("td", {}, nominal), el("td", {}, borrowing), el("td", {}, lending), el("td", {}, button),
        el("td", {}, bar(f.used, f.nominal, f.borrowed, scale[f.flavor]), el("span", { class: "used", text: `${f.used} / ${f.nominal}` })),
        el("td", { class: "borrowed", text: String(f.borrowed) }),
        el("td", { class: "pending", text: `${usage.pending_jobs} jobs, ${usage.pending_gpus} GPUs` }),
        el("td", { text: usage.recent_gpus.toFixed(2) }), el("td", { text: usage.gpu_hours.toFixed(2) })));
    }
  }
  document.getElementById("quotas").replaceChildren(...rows);
  document.getElementById("flavors").replaceChildren(...view.flavors.map((f) => el("tr", {},
    el("td", { text: f.flavor }), el("td", { text: f.backend }),
    el("td", { text: f.capacity_gpus ? String(f.capacity_gpus) : "backend not configured" }),
    el("td", { text: String(f.nominal_total) }))));
}

// A value in the audit log: short ones inline; a long one (a whole tenancy document, as the
// seed records) folded, so that it neither widens the table nor buries the rows below it.
function auditValue(v) {
  if (v === null) return el("td");
  const value = v.value !== undefined && Object.keys(v).length === 1 ? v.value : v;
  const text = JSON.stringify(value);
  if (text.length <= 160) return el("td", { class: "json", text });
  const keys = value && typeof value === "object" ? Object.keys(value).join(", ") : "";
  return el("td", { class: "json" }, el("details", {}, el("summary", { text: `{${keys}} (${text.length} characters)` }),
    el("pre", { text: JSON.stringify(value, null, 2) })));
}

function renderAudit(events) {
  document.getElementById("audit").replaceChildren(...events.map((e) => el("tr", {},
    el("td", { text: new Date(e.at).toLocaleString() }), el("td", { text: e.actor }),
    el("td", { text: `${e.action} ${e.target}` }), auditValue(e.before), auditValue(e.after))));
}

function renderNodes(nodes) {
  const rows = nodes.length ? nodes.map((n) => el("tr", { "data-node": n.node },
    el("td", { text: n.node }), el("td", { text: String(n.faults) }), el("td", { text: n.jobs.join(", ") }),
    el("td", { text: new Date(n.last_at).toLocaleString() }),
    el("td", { text: n.flagged ? "repeated faults: check this node" : "" })))
    : [el("tr", {}, el("td", { colspan: "5", class: "muted", text: "no node faults" }))];
  document.getElementById("nodes").replaceChildren(...rows);
}

// The periodic refresh re-renders every input: skip it while an edit is in progress (an
// input has focus or holds a value not saved yet), also when the edit began during the fetch.
const editing = () => (document.activeElement && document.activeElement.tagName === "INPUT") ||
  [...document.querySelectorAll("input")].some((input) => input.value !== input.defaultValue);

async function load({ refresh = false } = {}) {
  try {
    const [view, events, nodes] = await Promise.all([api("tenancy"), api("audit?limit=100"), api("nodes")]);
    if (refresh && editing()) return;
    document.getElementById("settings").textContent =
      `fair-share half-life ${view.fair_share_half_life_s} s · preemption grace ${view.preemption_grace_s} s`;
    renderTree(view.tenancy);
    renderQuotas(view);
    renderAudit(events);
    renderNodes(nodes);
  } catch (err) {
    show("error", `could not load: ${err.message}`);
  }
}

load();
setInterval(() => { if (!editing()) load({ refresh: true }); }, 10000);
