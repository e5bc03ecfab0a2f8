// The operator's console: every action is one AdminService call through /api/<Method>,
// made with the operator's own credential (kept in this tab's sessionStorage only).
const KEY = "atelier-console-credential";
const $ = (selector) => document.querySelector(selector);
const TERMINAL = new Set(["JOB_STATUS_SUCCEEDED", "JOB_STATUS_FAILED", "JOB_STATUS_CANCELLED"]);

class Refused extends Error {
  constructor(status, body) {
    const reason = (body.details || []).find((d) => d.reason)?.reason || "";
    super(`${body.message || "refused"}${reason ? ` (${reason})` : ""}`);
    this.status = status;
    this.reason = reason;
  }
}

async function call(method, body = {}) {
  const credential = sessionStorage.getItem(KEY) || "";
  const response = await fetch(`/api/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${credential}` },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) throw new Refused(response.status, answer);
  return answer;
}

function text(value) {
  return value === undefined || value === null || value === "" ? "–" : String(value);
}

function when(stamp) {
  if (!stamp) return "–";
  const date = new Date(stamp);
  return Number.isNaN(date.getTime()) ? "–" : date.toLocaleString();
}

function seconds(duration) {
  const value = parseFloat(String(duration || "0s"));
  if (!value) return "none queued";
  return value < 120 ? `${value.toFixed(0)} s` : `${(value / 60).toFixed(1)} min`;
}

function short(status) {
  return String(status || "").replace(/^(JOB_STATUS_|PROVIDER_REQUEST_STATE_|PROVIDER_REQUEST_SOURCE_|ACTOR_KIND_|LEDGER_ENTRY_KIND_|PUSH_KIND_|FAILED_PUSH_STATE_|APNS_ENVIRONMENT_)/, "").toLowerCase().replaceAll("_", " ");
}

function row(cells, action) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    td.textContent = text(cell);
    tr.append(td);
  }
  const td = document.createElement("td");
  if (action) td.append(action);
  tr.append(td);
  return tr;
}

function button(label, name, onClick) {
  const made = document.createElement("button");
  made.type = "button";
  made.textContent = label;
  made.setAttribute("aria-label", name);
  made.addEventListener("click", onClick);
  return made;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// -- sign in ----------------------------------------------------------------------------

async function signIn(credential) {
  sessionStorage.setItem(KEY, credential);
  try {
    const caller = await call("GetCaller");
    $("#who").textContent = `Signed in as ${caller.identity}`;
    $("#sign-in").hidden = true;
    $("#sign-out").hidden = false;
    $("#tabs").hidden = false;
    $("#main").hidden = false;
    $("#sign-in-error").textContent = "";
    await showOverview();
  } catch (error) {
    sessionStorage.removeItem(KEY);
    $("#sign-in-error").textContent = `Not signed in: ${error.message}`;
  }
}

function signOut() {
  sessionStorage.removeItem(KEY);
  $("#who").textContent = "Signed out";
  $("#sign-in").hidden = false;
  $("#sign-out").hidden = true;
  $("#tabs").hidden = true;
  $("#main").hidden = true;
  $("#credential").value = "";
}

// -- tabs (arrow keys move between them, as the ARIA tabs pattern says) -----------------

const TABS = ["overview", "attention", "search", "webhooks", "pushes"];
const LOADERS = {
  overview: showOverview,
  attention: showAttention,
  search: async () => {},
  webhooks: showWebhooks,
  pushes: () => showPushes(),
};

async function select(name) {
  for (const tab of TABS) {
    const chosen = tab === name;
    const control = $(`#tab-${tab}`);
    control.setAttribute("aria-selected", String(chosen));
    control.tabIndex = chosen ? 0 : -1;
    $(`#${tab}`).hidden = !chosen;
  }
  $("#inspect").hidden = true;
  await LOADERS[name]().catch(report);
}

function tabKeys(event) {
  const index = TABS.findIndex((t) => `tab-${t}` === event.target.id);
  if (index < 0) return;
  let next = null;
  if (event.key === "ArrowRight") next = TABS[(index + 1) % TABS.length];
  if (event.key === "ArrowLeft") next = TABS[(index + TABS.length - 1) % TABS.length];
  if (event.key === "Home") next = TABS[0];
  if (event.key === "End") next = TABS[TABS.length - 1];
  if (next) {
    event.preventDefault();
    $(`#tab-${next}`).focus();
    select(next);
  }
}

function report(error) {
  $("#resolved").textContent = `Error: ${error.message}`;
}

// -- overview ---------------------------------------------------------------------------

async function showOverview() {
  const view = await call("GetQueueOverview", { runningPageSize: 50 });
  $("#queued").textContent = text(view.queued);
  $("#queued-due").textContent = text(view.queuedDue);
  $("#oldest").textContent = seconds(view.oldestQueuedAge);
  $("#running").textContent = text(view.running);
  $("#needs-attention").textContent = text(view.needsAttention);
  $("#attention-count").textContent = view.needsAttention ? `(${view.needsAttention})` : "";
  fill(
    $("#running-jobs tbody"),
    view.runningJobs.map(({ job, internals }) =>
      row(
        [job.jobId, job.userId, internals.step, internals.leaseOwner, when(internals.leaseExpireTime)],
        button("Inspect", `Inspect job ${job.jobId}`, () => inspect(job.jobId)),
      ),
    ),
  );
}

// -- the attention queue ----------------------------------------------------------------

async function showAttention() {
  const listed = await call("ListAttentionJobs", { pageSize: 100 });
  $("#attention-empty").hidden = listed.jobs.length > 0;
  fill(
    $("#attention-jobs tbody"),
    listed.jobs.map((job) =>
      row(
        [job.jobId, job.userId, job.modelId, when(job.updateTime)],
        button("Inspect", `Inspect job ${job.jobId}`, () => inspect(job.jobId)),
      ),
    ),
  );
}

// -- one job: what the provider holds, the timeline, the decision ------------------------

let inspected = null;

function summary(job, internals) {
  const items = [
    ["Status", short(job.status)],
    ["User", job.userId],
    ["Model", job.modelId],
    ["Attempt", `${job.attempt} of ${job.maxAttempts}`],
    ["Step", internals.step],
    ["Provider", `${internals.providerCode} (${internals.providerModel})`],
    ["Recorded request", internals.providerRequestId],
    ["Error", internals.errorCode ? `${internals.errorCode}: ${internals.errorMessage}` : ""],
  ];
  $("#inspect-summary").replaceChildren(
    ...items.map(([name, value]) => {
      const div = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = name;
      dd.textContent = text(value);
      if (name === "Status") dd.id = "inspect-status";
      div.append(dt, dd);
      return div;
    }),
  );
}

async function inspect(jobId, { focus = true } = {}) {
  const answer = await call("InspectJob", { jobId });
  inspected = answer;
  const { job, internals } = answer;
  $("#inspect").hidden = false;
  $("#inspect-id").textContent = job.jobId;
  summary(job, internals);
  $("#lookup-note").textContent = answer.lookupSupported
    ? answer.lookupNote || "The adapter looked the job's requests up by its id."
    : `This provider's adapter cannot look requests up: ${answer.lookupNote}`;
  fill(
    $("#provider-requests tbody"),
    answer.providerRequests.map((request) =>
      row(
        [request.requestId, short(request.source), `${short(request.state)}${request.state === "PROVIDER_REQUEST_STATE_RUNNING" ? ` ${request.progressPercent}%` : ""}`, request.attempt || "", when(request.submitTime)],
        job.status === "JOB_STATUS_NEEDS_ATTENTION"
          ? button("Adopt", `Adopt request ${request.requestId}`, () => chooseAdopt(request.requestId))
          : null,
      ),
    ),
  );
  $("#timeline").replaceChildren(
    ...answer.events.map((event) => {
      const li = document.createElement("li");
      const from = event.fromStatus && event.fromStatus !== "JOB_STATUS_UNSPECIFIED" ? `${short(event.fromStatus)} → ` : "";
      li.textContent = `${when(event.createTime)} · ${from}${short(event.toStatus)} · ${short(event.actorKind)} ${event.actorId}${event.reason ? ` · ${event.reason}` : ""}`;
      return li;
    }),
  );
  $("#resolve-form").hidden = job.status !== "JOB_STATUS_NEEDS_ATTENTION";
  if (focus) $("#inspect-title").focus();
  return answer;
}

function chooseAdopt(requestId) {
  $("#resolution").value = "RESOLUTION_ADOPT";
  $("#request-id").value = requestId;
  resolutionChanged();
  $("#reason").focus();
}

function resolutionChanged() {
  const adopt = $("#resolution").value === "RESOLUTION_ADOPT";
  $("#request-field").hidden = !adopt;
  $("#request-id").required = adopt;
  $("#retry-warning").hidden = $("#resolution").value !== "RESOLUTION_RETRY";
}

async function resolve(event) {
  event.preventDefault();
  if (!inspected) return;
  const jobId = inspected.job.jobId;
  const resolution = $("#resolution").value;
  const body = { jobId, resolution, reason: $("#reason").value.trim() };
  if (resolution === "RESOLUTION_ADOPT") body.providerRequestId = $("#request-id").value.trim();
  try {
    const answer = await call("ResolveJob", body);
    $("#resolve-error").textContent = "";
    $("#reason").value = "";
    $("#resolved").textContent = `Recorded: job is ${short(answer.job.status)}`;
    await follow(jobId);
  } catch (error) {
    $("#resolve-error").textContent = error.message;
  }
}

// After a decision, the job is read again until it ends (or a minute passes).
async function follow(jobId) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const answer = await inspect(jobId, { focus: false });
    const status = answer.job.status;
    $("#resolved").textContent = `The job is ${short(status)}`;
    if (TERMINAL.has(status) || status === "JOB_STATUS_NEEDS_ATTENTION" || Date.now() > deadline) {
      // The queue and its figures as they are after the decision.
      await Promise.all([showAttention(), showOverview()]).catch(report);
      return;
    }
    await new Promise((done) => setTimeout(done, 1000));
  }
}

// -- search and a user's points ---------------------------------------------------------

async function search(event) {
  event.preventDefault();
  const by = document.querySelector("input[name=by]:checked").value;
  const value = $("#search-text").value.trim();
  try {
    const found = await call("SearchJobs", { [by]: value, pageSize: 50 });
    $("#search-results").hidden = false;
    fill(
      $("#search-results tbody"),
      found.jobs.map((job) =>
        row(
          [job.jobId, job.userId, short(job.status), when(job.createTime)],
          button("Inspect", `Inspect job ${job.jobId}`, () => inspect(job.jobId)),
        ),
      ),
    );
    $("#ledger").hidden = by !== "userId";
    if (by === "userId") await showLedger(value);
    $("#resolved").textContent = `${found.jobs.length} job(s) found`;
  } catch (error) {
    report(error);
  }
}

async function showLedger(userId) {
  const points = await call("ListUserLedger", { userId, pageSize: 100 });
  $("#balance").textContent = `${points.availablePoints} points available, ${points.reservedPoints} reserved`;
  fill(
    $("#ledger-entries tbody"),
    points.ledgerEntries.map((entry) => {
      const tr = row([when(entry.createTime), short(entry.kind), entry.amount, entry.jobId || entry.reason]);
      tr.lastChild.remove();
      return tr;
    }),
  );
}

// -- webhooks ---------------------------------------------------------------------------

async function showWebhooks() {
  const endpoints = await call("ListWebhookEndpoints", { pageSize: 100 });
  const rows = [];
  for (const endpoint of endpoints.endpoints) {
    const failed = await call("ListWebhookDeliveries", {
      endpointId: endpoint.endpointId,
      state: "WEBHOOK_DELIVERY_STATE_FAILED",
      pageSize: 100,
    });
    for (const delivery of failed.deliveries) {
      rows.push(
        row(
          [endpoint.url, delivery.eventType, delivery.jobId, delivery.attempts, delivery.lastError],
          button("Redeliver", `Redeliver delivery ${delivery.deliveryId}`, () => chooseRedeliver(delivery.deliveryId)),
        ),
      );
    }
  }
  $("#deliveries-empty").hidden = rows.length > 0;
  fill($("#deliveries tbody"), rows);
}

// A redelivery asks why, as a decision does; the reason is logged with the operator.
let redelivering = null;

function chooseRedeliver(deliveryId) {
  redelivering = deliveryId;
  $("#redeliver-id").textContent = deliveryId;
  $("#redeliver-error").textContent = "";
  $("#redeliver-form").hidden = false;
  $("#redeliver-reason").focus();
}

function closeRedeliver() {
  redelivering = null;
  $("#redeliver-form").hidden = true;
  $("#redeliver-reason").value = "";
}

async function redeliver(event) {
  event.preventDefault();
  if (redelivering === null) return;
  const deliveryId = redelivering;
  try {
    const answer = await call("RedeliverWebhooks", { deliveryId, reason: $("#redeliver-reason").value.trim() });
    closeRedeliver();
    $("#redelivered").textContent = `Delivery ${deliveryId} redelivered (${answer.redeliveredCount})`;
    await showWebhooks();
  } catch (error) {
    $("#redeliver-error").textContent = error.message;
  }
}

// -- failed pushes (notify's NotifyAdminService) -----------------------------------------

let pushesToken = "";

function pushAnswer(push) {
  const status = push.httpStatus ? `${push.httpStatus} ` : "";
  return `${status}${push.reason || "no answer"}${push.apnsId ? ` (apns-id ${push.apnsId})` : ""}`;
}

async function showPushes({ more = false } = {}) {
  const body = { pageSize: 50 };
  const since = $("#pushes-since").value;
  if (since) body.since = new Date(since).toISOString();
  if (more) body.pageToken = pushesToken;
  const listed = await call("ListFailedPushes", body);
  const rows = listed.pushes.map((push) => {
    const tr = row([
      when(push.createTime),
      short(push.kind),
      `${push.jobId} v${push.jobVersion}`,
      push.userId,
      `…${push.deviceTokenSuffix} (${short(push.environment)})`,
      pushAnswer(push),
      push.attempts,
    ]);
    tr.lastChild.textContent = short(push.state);
    return tr;
  });
  const tbody = $("#failed-pushes tbody");
  if (more) tbody.append(...rows);
  else fill(tbody, rows);
  pushesToken = listed.nextPageToken;
  $("#pushes-more").hidden = !pushesToken;
  $("#pushes-empty").hidden = tbody.children.length > 0;
}

// -- wiring -----------------------------------------------------------------------------

function start() {
  $("#sign-in").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("#credential").value.trim());
  });
  $("#sign-out").addEventListener("click", signOut);
  for (const tab of TABS) $(`#tab-${tab}`).addEventListener("click", () => select(tab));
  $("#tabs").addEventListener("keydown", tabKeys);
  $("#refresh-overview").addEventListener("click", () => showOverview().catch(report));
  $("#refresh-attention").addEventListener("click", () => showAttention().catch(report));
  $("#refresh-webhooks").addEventListener("click", () => showWebhooks().catch(report));
  $("#redeliver-form").addEventListener("submit", redeliver);
  $("#redeliver-cancel").addEventListener("click", closeRedeliver);
  $("#pushes-form").addEventListener("submit", (event) => {
    event.preventDefault();
    showPushes().catch(report);
  });
  $("#pushes-more").addEventListener("click", () => showPushes({ more: true }).catch(report));
  $("#resolution").addEventListener("change", resolutionChanged);
  $("#resolve-form").addEventListener("submit", resolve);
  $("#search-form").addEventListener("submit", search);
  resolutionChanged();
  const kept = sessionStorage.getItem(KEY);
  if (kept) signIn(kept);
  document.body.dataset.ready = "true";
}

start();
