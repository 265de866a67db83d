// The cellscale admin page: reads /api/admin/tenancy and /api/admin/audit, edits quotas,
// weights and budgets with PUTs; plots the desks' cost from /api/cost/series. Text goes in with
// textContent only: nothing is parsed as HTML.
"use strict";
const PREFIX = document.body.dataset.prefix;
// The page's anti-CSRF token: the control plane refuses a change signed in by the cookie without it.
const CSRF = document.querySelector('meta[name="cellscale-csrf"]').content;
// A call to the control plane's API (`/api/PATH`); `api` is the admin part of it (`/api/admin/PATH`).
const call = (path, { headers = {}, ...options } = {}) =>
  fetch(`${PREFIX}/api/${path}`,
    { credentials: "same-origin", headers: { "X-CSRF-Token": CSRF, ...headers }, ...options }).then(async (r) => {
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(explain(body.detail) || `${r.status} ${r.statusText}`);
    return body;
  });
const api = (path, options) => call(`admin/${path}`, options);

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

// Memory in MiB as people read it: 512 MiB, 4 GiB, 1.5 GiB, 2 TiB (as the panel and the notebook show it).
function memory(mb) {
  const units = ["MiB", "GiB", "TiB"];
  let i = 0;
  for (; mb >= 1024 && i < units.length - 1; i++) mb /= 1024;
  return `${Math.round(mb * 10) / 10} ${units[i]}`;
}

// A memory quota's input: a size with a unit, as the tenancy YAML writes it ("64G"; a bare number is MiB).
function memoryInput(label, mb, allowEmpty) {
  const value = mb === null || mb === undefined ? "" : mb && !(mb % 1024) ? `${mb / 1024}G` : String(mb);
  return el("input", { type: "text", "aria-label": label, value,
    placeholder: allowEmpty ? "none" : "e.g. 64G" });
}

// The resources a quota divides: GPUs in the quota's own fields, cores and memory in its `cpu`
// and `memory` parts (shown where set). `show` writes an amount; `input` edits one.
const RESOURCES = {
  gpu: { label: "GPUs", show: String, input: numberInput },
  cpu: { label: "CPUs", show: String, input: numberInput },
  memory: { label: "memory", show: memory, input: memoryInput },
};

function bar(used, nominal, borrowed, scale, show = String) {
  const width = 160, height = 14, px = (n) => (scale ? (n / scale) * width : 0);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "bar");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${show(used)} used of ${show(nominal)} nominal, ${show(borrowed)} borrowed`);
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

function shareEditor(name, rows) {
  const input = el("input", { type: "number", min: "0", max: "1", step: "0.05", value: String(rows[0].share),
    "aria-label": `short-work share of ${name}` });
  const button = el("button", { type: "button", text: "set share", "aria-label": `set short-work share of ${name}`,
    onclick: () => save(`cohorts/${encodeURIComponent(name)}/short-work-share`,
      { short_work_share: Number(input.value) }, `short-work share of ${name}`) });
  const lends = rows.map((r) => `${r.flavor}: lends ${r.lent} of ${r.gpus} GPUs`
    + (r.jobs.length ? ` (${r.jobs.join(", ")})` : "")
    + (r.lender_wait_max_s ? `, a lender waited up to ${Math.ceil(r.lender_wait_max_s / 60)} min` : "")).join("; ");
  return el("span", { "data-short-work": name }, " · short-work share ", input, " ", button,
    el("span", { class: "muted", text: ` ${lends}` }));
}

function renderTree(doc, shortWork) {
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
      const shares = shortWork.filter((r) => kind === "cohort" && r.cohort === name);
      if (shares.length) li.append(shareEditor(name, shares));
      if (kind === "cq") li.append(el("span", { class: "muted", text: ` ← tenants: ${(tenantsOf[name] || []).join(", ") || "none"}` }));
      else li.append(list(name));
      ul.append(li);
    }
    return ul;
  };
  document.getElementById("tree").replaceChildren(list(""));
}

// A flavor's capacity and a queue's use of one resource there, as the bars and cells show them.
function capacityOf(f, resource) {
  return { gpu: f.capacity_gpus || f.nominal_total, cpu: f.capacity_cpus || f.cpu_nominal_total,
    memory: f.capacity_memory_mb || f.memory_mb_nominal_total }[resource] || 0;
}

function useOf(f, resource) {
  const [used, nominal] = { gpu: [f.used, f.nominal], cpu: [f.cpus_used, f.cpu_nominal],
    memory: [f.memory_mb_used, f.memory_mb_nominal] }[resource];
  return { used, nominal, borrowed: resource === "gpu" ? f.borrowed : Math.max(0, used - nominal) };
}

// The resources of a queue's quota on a flavor: cores and memory where quota'd, and GPUs (but
// not on a CPU pool whose quota sets cores or memory: its GPU numbers are kept as they are).
function resourcesOf(quota, cpuPool) {
  const others = ["cpu", "memory"].filter((r) => quota[r]);
  return cpuPool && others.length ? others : ["gpu", ...others];
}

function renderQuotas(view) {
  // each flavor is its own pool of each resource: its bars share a scale (its capacity), not the largest pool's
  const scale = {};
  for (const f of view.flavors)
    for (const r of Object.keys(RESOURCES)) scale[`${f.flavor}/${r}`] = Math.max(1, capacityOf(f, r));
  for (const usage of view.usage)
    for (const f of usage.flavors)
      for (const r of Object.keys(RESOURCES)) {
        const { used, nominal } = useOf(f, r);
        scale[`${f.flavor}/${r}`] = Math.max(scale[`${f.flavor}/${r}`], nominal || 0, used);
      }
  const cpuPools = new Set(view.flavors.filter((f) => f.cpu_only).map((f) => f.flavor));
  const rows = [];
  for (const usage of view.usage) {
    const queueRows = [];
    for (const f of usage.flavors) {
      const quota = view.tenancy.cluster_queues[usage.cluster_queue].quotas[f.flavor];
      queueRows.push(...quotaRows(usage, f, quota, cpuPools.has(f.flavor), scale));
    }
    if (queueRows.length) queueRows[0].append(...queueTotals(usage, queueRows.length));
    rows.push(...queueRows);
  }
  document.getElementById("quotas").replaceChildren(...rows);
  document.getElementById("flavors").replaceChildren(...view.flavors.map(flavorRow));
}

// One row per resource of a queue's quota on a flavor; the queue, the flavor, the save button
// and the queue's totals span them. Saving sends the whole quota, every resource's part.
function quotaRows(usage, f, quota, cpuPool, scale) {
  const name = `${usage.cluster_queue} ${f.flavor}`;
  const resources = resourcesOf(quota, cpuPool);
  const inputs = {};
  const cells = resources.map((r) => {
    const { label, show, input } = RESOURCES[r];
    const part = r === "gpu" ? quota : quota[r];
    const prefix = r === "gpu" ? "" : `${r} `;
    inputs[r] = {
      nominal: input(`${prefix}nominal ${name}`, part.nominal, false),
      borrowing_limit: input(`${prefix}borrowing limit ${name}`, part.borrowing_limit, true),
      lending_limit: input(`${prefix}lending limit ${name}`, part.lending_limit, true),
    };
    const { used, nominal, borrowed } = useOf(f, r);
    return {
      quota: [el("td", { text: label }), ...Object.values(inputs[r]).map((box) => el("td", {}, box))],
      use: [el("td", {}, bar(used, nominal, borrowed, scale[`${f.flavor}/${r}`], show),
        el("span", { class: "used", text: `${show(used)} / ${show(nominal)}` })),
      el("td", { class: "borrowed", text: show(borrowed) })],
    };
  });
  const span = { rowspan: String(cells.length) };
  const button = el("button", { type: "button", text: "save", "aria-label": `save ${name} quota`,
    onclick: () => saveQuota(usage.cluster_queue, f.flavor, quotaBody(quota, inputs), `${name} quota`) });
  return cells.map((c, i) => el("tr", { "data-queue": usage.cluster_queue, "data-flavor": f.flavor,
    "data-resource": resources[i] }, ...(i ? [...c.quota, ...c.use] : [
    el("td", { ...span, text: usage.cluster_queue }),
    el("td", span, `${f.flavor} (${f.backend})`, cpuPool ? el("span", { class: "muted", text: " CPU pool" }) : ""),
    ...c.quota, el("td", span, button), ...c.use])));
}

// A queue's own totals, once beside all of its rows (they are the queue's, not one flavor's).
function queueTotals(usage, rows) {
  const span = { rowspan: String(rows) };
  return [
    el("td", { ...span, class: "pending",
      text: `${usage.pending_jobs} jobs, ${usage.pending_gpus} GPUs, ${usage.pending_cpus} CPUs` }),
    el("td", { ...span, text: usage.recent_gpus.toFixed(2) }),
    el("td", { ...span, "data-field": "gpu-hours", text: usage.gpu_hours.toFixed(2) })];
}

// The PUT body: the whole quota in force with the edited resources' numbers in it (GPUs in its
// own fields, cores and memory in their parts), so that saving one resource keeps the others.
function quotaBody(quota, inputs) {
  const value = (box) => (box.value.trim() === "" ? null : box.type === "number" ? Number(box.value) : box.value.trim());
  const part = (boxes) => Object.fromEntries(Object.entries(boxes).map(([k, box]) => [k, value(box)]));
  const body = { ...quota };
  for (const [r, boxes] of Object.entries(inputs)) {
    if (r === "gpu") Object.assign(body, part(boxes));
    else body[r] = part(boxes);
  }
  return body;
}

function saveQuota(queue, flavor, body, what) {
  return save(`cluster-queues/${encodeURIComponent(queue)}/quotas/${encodeURIComponent(flavor)}`, body, what);
}

// A flavor: its kind, its backend's capacity in each resource, the nominal quotas on it.
function flavorRow(f) {
  const configured = f.capacity_gpus || f.capacity_cpus;
  const counted = (n, show) => (n == null ? "not counted" : show(n));
  const totals = [`${f.nominal_total} GPUs`];
  if (f.cpu_nominal_total != null) totals.push(`${f.cpu_nominal_total} CPUs`);
  if (f.memory_mb_nominal_total != null) totals.push(memory(f.memory_mb_nominal_total));
  return el("tr", { "data-flavor": f.flavor },
    el("td", {}, f.flavor, f.cpu_only ? el("span", { class: "muted", text: " CPU pool" }) : ""),
    el("td", { text: f.backend }),
    el("td", { text: configured ? String(f.capacity_gpus) : "backend not configured" }),
    el("td", { text: configured ? counted(f.capacity_cpus, String) : "" }),
    el("td", { text: configured ? counted(f.capacity_memory_mb, memory) : "" }),
    el("td", { text: totals.join(" · ") }),
    el("td", { "data-field": "gpu-hours", text: f.gpu_hours.toFixed(2) }));
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

// --- cost -------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
// one colour per desk, in the order of the desks' names (the legend says which)
const PALETTE = ["#2b7bb9", "#e08a1e", "#27ae60", "#c0392b", "#8e44ad", "#16a085", "#d35400", "#7f8c8d"];

function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Dollars as the page shows them: "$0.42", "$84", "$1,234", "-$3".
function usd(n) {
  const digits = Math.abs(n) < 10 && n !== Math.round(n) ? 2 : 0;
  const text = Math.abs(n).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  return `${n < 0 ? "-" : ""}$${text}`;
}

const hours = (n) => (n < 10 ? n.toFixed(2) : n.toFixed(1));

// A line plot of one field of the series: a polyline per desk over the steps, the axes with
// the largest value and the first and last day, and a legend. Drawn by hand: a few SVG elements.
function plot(series, field, label, show) {
  const width = 520, height = 200, left = 56, bottom = 22, top = 8, right = 8;
  const starts = [...new Set(series.points.map((p) => p.start))].sort();
  const desks = [...new Set(series.points.map((p) => p.tenant))].sort();
  const value = {};
  for (const p of series.points) value[`${p.tenant} ${p.start}`] = p[field];
  const max = Math.max(0, ...series.points.map((p) => p[field]));
  const x = (i) => left + (starts.length > 1 ? (i / (starts.length - 1)) * (width - left - right) : 0);
  const y = (v) => top + (1 - (max ? v / max : 0)) * (height - top - bottom);
  const svg = svgEl("svg", { class: "plot", width, height, role: "img", "data-field": field,
    "aria-label": `${label}: ${desks.length} desks over ${starts.length} days, at most ${show(max)}` });
  svg.append(svgEl("line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom }),
    svgEl("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }),
    svgEl("text", { x: left - 4, y: top + 4, "text-anchor": "end" }, show(max)),
    svgEl("text", { x: left - 4, y: height - bottom, "text-anchor": "end" }, show(0)));
  if (starts.length) {
    svg.append(svgEl("text", { x: left, y: height - 6 }, new Date(starts[0]).toLocaleDateString()),
      svgEl("text", { x: width - right, y: height - 6, "text-anchor": "end" },
        new Date(starts[starts.length - 1]).toLocaleDateString()));
  }
  desks.forEach((desk, d) => {
    const points = starts.map((start, i) => `${x(i).toFixed(1)},${y(value[`${desk} ${start}`] || 0).toFixed(1)}`);
    const line = svgEl("polyline", { points: points.join(" "), stroke: PALETTE[d % PALETTE.length], "data-tenant": desk });
    line.append(svgEl("title", {}, desk));
    svg.append(line);
  });
  const legend = el("p", { class: "legend" }, ...desks.map((desk, d) => {
    const swatch = el("i", { class: "swatch" });
    swatch.style.background = PALETTE[d % PALETTE.length];
    return el("span", { "data-tenant": desk }, swatch, desk);
  }));
  if (!desks.length) legend.append(el("span", { class: "muted", text: "no cost in the last 30 days" }));
  return [svg, legend];
}

function renderCost(cost, series) {
  document.getElementById("cost-plot").replaceChildren(...plot(series, "total_usd", "Cost per desk", usd));
  document.getElementById("hours-plot").replaceChildren(...plot(series, "gpu_hours", "GPU-hours per desk", hours));
  const f = cost.fleet;
  document.getElementById("fleet").textContent = !f ? "" :
    `fleet ${usd(f.fleet_usd)} = desks ${usd(f.desks_usd)} + shared idle ${usd(f.shared_idle_usd)} + ` +
    `overhead ${usd(f.overhead_usd)} · ${f.identity_error <= 0.01 ? "reconciles" :
      `off by ${(f.identity_error * 100).toFixed(1)}%`} · idle policy ${cost.idle_policy}`;
  const rows = cost.top_idle_jobs.length ? cost.top_idle_jobs.map((j) => el("tr", { "data-job": j.job_id },
    el("td", {}, el("code", { text: j.job_id })), el("td", { text: j.tenant }), el("td", { text: j.user }),
    el("td", { text: hours(j.gpu_hours) }),
    el("td", { text: j.efficiency == null ? "not sampled" : `${Math.round(j.efficiency * 100)}%` }),
    el("td", { text: usd(j.idle_usd) })))
    : [el("tr", {}, el("td", { colspan: "6", class: "muted", text: "no idle jobs" }))];
  document.getElementById("idle-jobs").replaceChildren(...rows);
}

// A budget's burn: spent of it (the larger of dollars and GPU-hours), orange once it is spent.
function burn(fraction, tenant) {
  const width = 160, height = 14;
  const svg = svgEl("svg", { class: "bar", width, height, role: "img",
    "aria-label": `${tenant} has spent ${Math.round(fraction * 100)}% of its budget` });
  svg.append(svgEl("rect", { x: 0, y: 0, width, height, fill: "var(--bar-track)" }),
    svgEl("rect", { x: 0, y: 0, width: Math.min(1, Math.max(0, fraction)) * width, height,
      fill: fraction >= 1 ? "var(--bar-borrowed)" : "var(--bar-used)" }));
  return svg;
}

function choice(label, value, options) {
  return el("select", { "aria-label": label }, ...options.map((o) =>
    el("option", { value: o, text: o, ...(o === value ? { selected: "" } : {}) })));
}

const PERIOD = { day: "per day", week: "per week", month: "per month" };
const DEFAULT_WARN_AT = [0.5, 0.8, 1];

// One row per desk: its burn against the budget in force (from /api/budgets) and an editor of
// the budget (from the tenancy) that PUTs the desk's cloud policy, its burst setting kept.
function renderBudgets(doc, budgets) {
  const spent = Object.fromEntries(budgets.map((b) => [b.tenant, b]));
  const rows = Object.entries(doc.tenants).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([name, t]) => {
    const budget = t.budget || null;
    const b = spent[name];
    const status = el("td", { class: "spent" });
    if (b) {
      const parts = [];
      if (b.usd != null) parts.push(`${usd(b.spent_usd)} / ${usd(b.usd)}`);
      if (b.gpu_hours != null) parts.push(`${hours(b.spent_gpu_hours)} / ${hours(b.gpu_hours)} GPU-hours`);
      status.append(burn(b.fraction, name), el("span", { class: "burn",
        text: `${parts.join(" · ")} ${PERIOD[b.period] || b.period} · ${Math.round(b.fraction * 100)}%` }));
      if (b.warning) status.append(el("div", { class: "warning", text: b.warning }));
      if (b.holding) status.append(el("div", { class: "warning holding", text: "holding new work" }));
    } else {
      status.append(el("span", { class: "muted", text: "no budget" }));
    }
    const inputs = {
      usd: el("input", { type: "number", min: "0", step: "any", "aria-label": `budget dollars ${name}`,
        value: budget && budget.usd != null ? String(budget.usd) : "", placeholder: "none" }),
      gpu_hours: el("input", { type: "number", min: "0", step: "any", "aria-label": `budget GPU-hours ${name}`,
        value: budget && budget.gpu_hours != null ? String(budget.gpu_hours) : "", placeholder: "none" }),
      period: choice(`budget period ${name}`, (budget && budget.period) || "week", ["day", "week", "month"]),
      covers: choice(`budget covers ${name}`, (budget && budget.covers) || "all", ["all", "cloud"]),
      warn_at: el("input", { type: "text", class: "warn-at", "aria-label": `budget warn at ${name}`,
        value: ((budget && budget.warn_at) || DEFAULT_WARN_AT).join(", ") }),
      hard_stop: el("input", { type: "checkbox", "aria-label": `budget hard stop ${name}`,
        ...(budget && budget.hard_stop ? { checked: "" } : {}) }),
    };
    const button = el("button", { type: "button", text: "save", "aria-label": `save budget of ${name}`,
      onclick: () => save(`tenants/${encodeURIComponent(name)}/cloud`,
        { burst: t.burst || "never", budget: budgetBody(inputs) }, `budget of ${name}`) });
    return el("tr", { "data-tenant": name }, el("td", { text: name }), status,
      ...Object.values(inputs).map((input) => el("td", {}, input)), el("td", {}, button));
  });
  document.getElementById("budgets").replaceChildren(...rows);
}

// The budget as the API takes it; null (no budget) when neither dollars nor GPU-hours are set.
// Numbers are sent as typed: the API explains what it refuses (a negative amount, a fraction of 0).
function budgetBody(inputs) {
  const amount = (box) => (box.value.trim() === "" ? null : Number(box.value));
  const [dollars, gpuHours] = [amount(inputs.usd), amount(inputs.gpu_hours)];
  if (dollars === null && gpuHours === null) return null;
  const warnAt = inputs.warn_at.value.split(/[\s,]+/).filter(Boolean).map(Number);
  return { usd: dollars, gpu_hours: gpuHours, period: inputs.period.value, covers: inputs.covers.value,
    ...(warnAt.length ? { warn_at: warnAt } : {}), hard_stop: inputs.hard_stop.checked };
}

// The periodic refresh re-renders every input: skip it while an edit is in progress (an
// input or a choice has focus or holds a value not saved yet), also when the edit began during the fetch.
const editing = () => (document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName)) ||
  [...document.querySelectorAll("input")].some((input) =>
    input.type === "checkbox" ? input.checked !== input.defaultChecked : input.value !== input.defaultValue) ||
  [...document.querySelectorAll("option")].some((option) => option.selected !== option.defaultSelected);

// The cost report and its series are sums over 30 days of the ledger: read at most once a minute.
const COST_EVERY_MS = 60000;
let costReadAt = 0;

async function load({ refresh = false } = {}) {
  try {
    const costDue = !refresh || Date.now() - costReadAt >= COST_EVERY_MS;
    const [view, events, nodes, budgets, cost, series] = await Promise.all([api("tenancy"), api("audit?limit=100"),
      api("nodes"), call("budgets"), costDue ? call("cost?days=30") : null,
      costDue ? call("cost/series?days=30&step_s=86400") : null]);
    if (refresh && editing()) return;
    document.getElementById("settings").textContent =
      `fair-share half-life ${view.fair_share_half_life_s} s · preemption grace ${view.preemption_grace_s} s`;
    renderTree(view.tenancy, view.short_work);
    renderQuotas(view);
    renderBudgets(view.tenancy, budgets);
    if (costDue) {
      costReadAt = Date.now();
      renderCost(cost, series);
    }
    renderAudit(events);
    renderNodes(nodes);
  } catch (err) {
    show("error", `could not load: ${err.message}`);
  }
}

load();
setInterval(() => { if (!editing()) load({ refresh: true }); }, 10000);
