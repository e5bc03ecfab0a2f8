// The atelier playground: sign in with a development token, upload a photo (or name one by
// its https address, or pick a model that makes pictures from the prompt alone), pick a
// model and a style, submit, watch the job live, see the result, the history and the balance.
// Plain ES modules, no build step; served by the edge at / (services/edge_static.py).

import { EdgeError, Unreachable, call, callJson, jsonLines, newRequestId, sleep, tokenSubject } from "./edge.js";

// Every edge route the page calls, in one table.
const q = encodeURIComponent;
export const ROUTES = {
  catalog: () => "/v1/catalog",
  balance: () => "/v1/balance",
  createUpload: () => "/v1/uploads",
  completeUpload: (assetId) => `/v1/uploads/${q(assetId)}:complete`,
  submitJob: () => "/v1/jobs",
  getJob: (jobId) => `/v1/jobs/${q(jobId)}`,
  listJobs: (pageSize) => `/v1/jobs?pageSize=${pageSize}`,
  cancelJob: (jobId) => `/v1/jobs/${q(jobId)}:cancel`,
  watchJob: (jobId, afterVersion) => `/v1/jobs/${q(jobId)}:watch?afterVersion=${afterVersion}`,
};

const TOKEN_KEY = "atelier.playground.token";
const HISTORY_SIZE = 12;
// A watch stream that keeps failing this many times in a row is given up.
const WATCH_FAILURES = 5;
const TERMINAL = new Set(["JOB_STATUS_SUCCEEDED", "JOB_STATUS_FAILED", "JOB_STATUS_CANCELLED"]);

const $ = (id) => document.getElementById(id);

const state = {
  token: "",
  assetId: "",
  catalogLoaded: false,
  jobId: "",
  watching: null, // the AbortController of the current job's watch stream
  // A job named in the address (#job=<id>) to show once signed in.
  pendingJob: "",
  // The catalog's display names by model and style id, for the history tiles.
  names: new Map(),
  // What each model does with a photo (Model.inputImage), by model id.
  inputImage: new Map(),
  // Each model's parameters (Model.parameterSpecs), by model id.
  specs: new Map(),
  // The job on screen as last drawn (a queue standing arrives without a new version).
  shown: null,
  // A limit the notice says was reached (an ErrorInfo reason), and its retry timer.
  limitReason: "",
  limitTimer: 0,
};

// The balance field that says whether a limit still holds, by the 429's reason.
const LIMIT_LEFT = {
  IN_FLIGHT_LIMIT_REACHED: "inFlightRemaining",
  DAILY_QUOTA_EXCEEDED: "dailyJobsRemaining",
};

// --- what the user sees -----------------------------------------------------------------

// A job's error as the user reads it: the message, what went wrong (the reason, without
// its enum prefix) and whether submitting again may help (JobError.retryable).
function errorText(error) {
  const reason = (error.reason ?? "JOB_ERROR_REASON_UNSPECIFIED").replace(/^JOB_ERROR_REASON_/, "");
  const advice = error.retryable ? "submitting again may work" : "submitting again will not help";
  return [error.message, `${reason.toLowerCase().replaceAll("_", " ")}; ${advice}`].filter(Boolean).join(" — ");
}

function notify(text, kind = "error") {
  clearTimeout(state.limitTimer);
  state.limitReason = "";
  const notice = $("notice");
  notice.textContent = text;
  notice.className = kind;
  notice.hidden = !text;
}

function clearFieldErrors() {
  for (const slot of document.querySelectorAll(".field-error")) slot.textContent = "";
}

/** Each BadRequest field violation next to its field; the rest in the notice. */
function showFieldErrors(violations) {
  const unplaced = [];
  const slots = [...document.querySelectorAll(".field-error")];
  for (const { field = "", description = "" } of violations) {
    // A parameter's own slot (parameters.seed), else its field's (prompt, width…).
    const name = field.split(/[.[]/)[0];
    const names = (s) => s.dataset.errorFor.split(" ");
    const slot = slots.find((s) => names(s).includes(field)) ?? slots.find((s) => names(s).includes(name));
    if (slot) slot.textContent = description;
    else unplaced.push(`${field}: ${description}`);
  }
  return unplaced;
}

/** A limit was reached (429): said until it passes. The balance tells when an in-flight
 * or daily limit passed (a job ended: see loadBalance); once the wait the answer asked
 * for is over the page looks again, and a limit the balance does not show just goes. */
function notifyLimit(error) {
  notify(error.describe(), "limit");
  state.limitReason = error.reason || "RESOURCE_EXHAUSTED";
  state.limitTimer = setTimeout(() => {
    if (LIMIT_LEFT[state.limitReason] && state.token) loadBalance().catch(() => {});
    else notify("");
  }, (error.retrySeconds ?? 1) * 1000);
}

/** Clears the notice of a reached limit that the balance shows has passed. */
function limitPassed(balance) {
  const left = LIMIT_LEFT[state.limitReason];
  if (left && Number(balance[left] ?? 0) > 0) notify("");
}

/** Any failure of an action, said the way a user understands it. */
function report(error) {
  if (error.name === "AbortError") return;
  if (error instanceof EdgeError && error.tooMany) {
    notifyLimit(error);
  } else if (error instanceof EdgeError) {
    const unplaced = showFieldErrors(error.fieldViolations);
    notify([error.describe(), ...unplaced].join(" "));
  } else if (error instanceof Unreachable) {
    notify(`${error.message}. Is the stack running, and did you open the page at the edge's address?`);
  } else {
    notify(String(error.message ?? error));
  }
}

const busy = () => notify("The service is busy, retrying…", "busy");

function api(url, options = {}) {
  return callJson(url, { token: state.token, onBusy: busy, ...options });
}

/** Runs an action with its button disabled; reports its failure. */
async function action(button, work) {
  if (button) button.disabled = true;
  clearFieldErrors();
  try {
    await work();
  } catch (error) {
    report(error);
  } finally {
    if (button) button.disabled = false;
    updateSubmit();
  }
}

/** What the chosen model does with a photo: INPUT_IMAGE_REQUIRED, _OPTIONAL or _REFUSED. */
function chosenInputImage() {
  return state.inputImage.get($("model").value) ?? "INPUT_IMAGE_REQUIRED";
}

/** The photo the request sends: an uploaded asset, an https address, or none. */
function chosenPhoto() {
  if (chosenInputImage() === "INPUT_IMAGE_REFUSED") return {};
  const url = $("photo-url").value.trim();
  if (url) return { inputUrl: url };
  return state.assetId ? { inputAssetId: state.assetId } : {};
}

// --- model parameters (the catalog's specs) ---------------------------------------------

/** A ParameterValue as text: whichever of its one value is set. */
function valueText(value) {
  if (!value) return "";
  for (const key of ["intValue", "floatValue", "boolValue", "stringValue"]) {
    if (value[key] !== undefined) return String(value[key]);
  }
  return "";
}

/** One field per parameter of the chosen model, empty meaning "the model's default". */
function showParameters() {
  const specs = state.specs.get($("model").value) ?? [];
  const fields = $("parameter-fields");
  fields.replaceChildren(...specs.map(parameterField));
  $("parameters").hidden = specs.length === 0;
}

function parameterField(spec) {
  const row = document.createElement("div");
  row.className = "parameter";
  const id = `parameter-${spec.name}`;
  const title = document.createElement("label");
  title.htmlFor = id;
  title.textContent = spec.name.replaceAll("_", " ");
  title.title = spec.description ?? "";
  const fallback = valueText(spec.defaultValue);
  let input;
  if (spec.type === "PARAMETER_TYPE_BOOL" || spec.type === "PARAMETER_TYPE_ENUM") {
    input = document.createElement("select");
    const choices = spec.type === "PARAMETER_TYPE_BOOL" ? ["true", "false"] : spec.choices ?? [];
    const unset = new Option(fallback ? `default (${fallback})` : "model's choice", "");
    input.replaceChildren(unset, ...choices.map((c) => new Option(c, c)));
  } else {
    input = document.createElement("input");
    const numeric = spec.type === "PARAMETER_TYPE_INT" || spec.type === "PARAMETER_TYPE_FLOAT";
    input.type = numeric ? "number" : "text";
    if (numeric) {
      input.step = spec.type === "PARAMETER_TYPE_INT" ? "1" : "any";
      // No min/max attributes: the browser would keep an out-of-range value from the
      // service, whose answer (a field violation) is what the page shows.
    }
    input.placeholder = fallback ? `default ${fallback}` : "model's choice";
  }
  input.id = id;
  input.dataset.parameter = spec.name;
  input.dataset.type = spec.type;
  const error = document.createElement("span");
  error.className = "field-error";
  error.dataset.errorFor = `parameters.${spec.name}`;
  const hint = document.createElement("p");
  hint.className = "hint";
  hint.textContent = spec.description ?? "";
  row.append(title, input, hint, error);
  return row;
}

/** SubmitJobRequest.parameters: each field given, in its type's JSON form (an int64 is a
 * string of digits, as the contract's JSON has it). */
function chosenParameters() {
  const parameters = {};
  for (const input of document.querySelectorAll("[data-parameter]")) {
    const text = input.value.trim();
    if (!text) continue;
    const name = input.dataset.parameter;
    switch (input.dataset.type) {
      case "PARAMETER_TYPE_INT":
        parameters[name] = { intValue: text };
        break;
      case "PARAMETER_TYPE_FLOAT":
        parameters[name] = { floatValue: Number(text) };
        break;
      case "PARAMETER_TYPE_BOOL":
        parameters[name] = { boolValue: text === "true" };
        break;
      default:
        parameters[name] = { stringValue: text };
    }
  }
  return parameters;
}

const PHOTO_HINTS = {
  INPUT_IMAGE_REQUIRED: "This model restyles your photo: upload one or give its address.",
  INPUT_IMAGE_OPTIONAL: "This model uses a photo when you give one.",
  INPUT_IMAGE_REFUSED: "This model paints from the prompt alone: no photo needed.",
};

function updateSubmit() {
  const needed = chosenInputImage() === "INPUT_IMAGE_REQUIRED";
  const photo = chosenPhoto();
  const ready = !needed || Boolean(photo.inputUrl || photo.inputAssetId);
  $("model-photo").textContent = state.catalogLoaded ? PHOTO_HINTS[chosenInputImage()] ?? "" : "";
  $("submit").disabled = !(state.token && state.catalogLoaded && ready);
}

const label = (status) => (status ?? "").replace(/^JOB_STATUS_/, "").replace(/_/g, " ").toLowerCase();

/** Keeps the job on screen in the address (#job=<id>), so a reload shows it again. */
function rememberJob(jobId) {
  const fragment = jobId ? `#job=${encodeURIComponent(jobId)}` : "";
  history.replaceState(null, "", `${location.pathname}${location.search}${fragment}`);
}

/** Signed in, the token field and Sign in give way to Sign out; signed out, back. */
function showSignedIn(signedIn) {
  for (const element of document.querySelectorAll(".signed-out")) element.hidden = signedIn;
  $("sign-out").hidden = !signedIn;
}

// --- sign in ----------------------------------------------------------------------------

async function signIn(token) {
  state.token = token.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  const who = tokenSubject(state.token);
  $("who").textContent = who ? `Signed in as ${who}.` : "Signed in.";
  showSignedIn(true);
  notify("");
  try {
    // The tiles name the model and style: the catalog first.
    await Promise.all([loadBalance(), loadCatalog().then(loadHistory)]);
  } catch (error) {
    if (error instanceof EdgeError && error.httpStatus === 401) signOut();
    throw error;
  }
  const pending = state.pendingJob;
  state.pendingJob = "";
  if (pending) {
    await open(pending).catch((error) => {
      rememberJob("");
      throw error;
    });
  }
}

function signOut() {
  state.watching?.abort();
  Object.assign(state, { token: "", assetId: "", jobId: "", watching: null, catalogLoaded: false });
  sessionStorage.removeItem(TOKEN_KEY);
  $("token").value = "";
  $("who").textContent = "";
  $("balance").textContent = "not signed in";
  showSignedIn(false);
  $("history").replaceChildren();
  $("job").hidden = true;
  $("no-job").hidden = false;
  rememberJob("");
  notify("");
  updateSubmit();
}

// --- catalog, balance, history ----------------------------------------------------------

function fill(select, items, idField) {
  select.replaceChildren(
    ...items.map((item) => {
      const option = document.createElement("option");
      option.value = item[idField];
      option.textContent = item.pricePoints !== undefined
        ? `${item.displayName} · ${item.pricePoints} pts`
        : item.displayName;
      option.title = item.description ?? "";
      return option;
    }),
  );
}

async function loadCatalog() {
  const catalog = await api(ROUTES.catalog());
  const byOrder = (a, b) => (a.sortOrder ?? 0) - (b.sortOrder ?? 0);
  fill($("model"), [...(catalog.models ?? [])].sort(byOrder), "modelId");
  fill($("style"), [...(catalog.styles ?? [])].sort(byOrder), "styleId");
  state.inputImage = new Map(
    (catalog.models ?? []).map((m) => [m.modelId, m.inputImage ?? "INPUT_IMAGE_REQUIRED"]),
  );
  state.specs = new Map((catalog.models ?? []).map((m) => [m.modelId, m.parameterSpecs ?? []]));
  showParameters();
  state.names = new Map([
    ...(catalog.models ?? []).map((m) => [`model:${m.modelId}`, m.displayName]),
    ...(catalog.styles ?? []).map((s) => [`style:${s.styleId}`, s.displayName]),
  ]);
  state.catalogLoaded = true;
  updateSubmit();
}

async function loadBalance() {
  const balance = await api(ROUTES.balance());
  const reserved = Number(balance.reservedPoints ?? 0);
  $("balance").textContent =
    `${balance.availablePoints ?? 0} points` + (reserved ? ` (${reserved} reserved)` : "");
  limitPassed(balance);
}

/** When a job was made: the time today, the day and time before. */
function madeAt(createTime) {
  const when = new Date(createTime);
  if (Number.isNaN(when.getTime())) return "";
  const time = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  if (when.toDateString() === new Date().toDateString()) return time;
  return `${when.toLocaleDateString([], { day: "numeric", month: "short" })}, ${time}`;
}

/** A tile's caption: status, model and style by name, when it was made. */
function tileCaption(job) {
  const caption = document.createElement("span");
  caption.className = "caption";
  const status = document.createElement("span");
  status.className = `status ${label(job.status)}`;
  status.textContent = label(job.status);
  const model = document.createElement("span");
  model.className = "tile-model";
  model.textContent = state.names.get(`model:${job.modelId}`) ?? job.modelId ?? "";
  const style = document.createElement("span");
  style.className = "tile-style";
  style.textContent = state.names.get(`style:${job.styleId}`) ?? job.styleId ?? "";
  const time = document.createElement("time");
  time.dateTime = job.createTime ?? "";
  time.title = job.createTime ?? "";
  time.textContent = madeAt(job.createTime);
  caption.append(status, model, style, time);
  return caption;
}

/** The picture to show for a job in the grid: its thumbnail when media made one. */
const tileUrl = (job) => job.outputs?.[0]?.thumbnailUrl || job.outputs?.[0]?.url || "";

async function loadHistory() {
  const { jobs = [] } = await api(ROUTES.listJobs(HISTORY_SIZE));
  $("history").replaceChildren(
    ...jobs.map((job) => {
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.jobId = job.jobId;
      button.dataset.status = job.status;
      const placeholder = document.createElement("span");
      placeholder.className = "placeholder";
      placeholder.textContent = "—";
      button.append(placeholder, tileCaption(job));
      button.addEventListener("click", () => action(null, () => open(job.jobId)));
      item.append(button);
      showTile(placeholder, job);
      return item;
    }),
  );
}

/** The job's picture in place of the placeholder. A list whose URLs came back empty (media
 * could not sign them in time) is completed with one GetJob per succeeded job; a failure
 * keeps the placeholder. */
function showTile(placeholder, job) {
  const put = (url) => {
    const img = document.createElement("img");
    img.src = url;
    img.alt = `job ${job.jobId}`;
    placeholder.replaceWith(img);
  };
  const url = tileUrl(job);
  if (url) put(url);
  else if (job.status === "JOB_STATUS_SUCCEEDED") {
    api(ROUTES.getJob(job.jobId))
      .then(({ job: full }) => tileUrl(full) && put(tileUrl(full)))
      .catch(() => {});
  }
}

// --- upload -----------------------------------------------------------------------------

async function upload(file) {
  state.assetId = "";
  updateSubmit();
  const preview = $("photo-preview");
  URL.revokeObjectURL(preview.src);
  preview.src = URL.createObjectURL(file);
  preview.hidden = false;
  $("upload-state").textContent = "Uploading…";
  const reserved = await api(ROUTES.createUpload(), {
    method: "POST",
    body: { purpose: "ASSET_PURPOSE_AI_INPUT", contentType: file.type, sizeBytes: file.size },
  });
  // The bytes go straight to storage at the signed URL, with the headers it was signed for.
  const headers = new Headers(reserved.uploadHeaders ?? {});
  if (!headers.has("content-type")) headers.set("content-type", file.type);
  try {
    await call(reserved.uploadUrl, {
      method: reserved.uploadMethod || "PUT",
      headers,
      rawBody: file,
      onBusy: busy,
    });
  } catch (error) {
    const storage = new URL(reserved.uploadUrl).origin;
    if (error instanceof Unreachable && storage !== location.origin) {
      // A browser refuses a cross-origin PUT the storage has no CORS rule for.
      throw new Error(
        `The photo goes to ${storage}, another origin than this page's: open the playground ` +
          `at ${storage}/ (or give the storage a CORS rule for ${location.origin}).`,
      );
    }
    throw error;
  }
  const assetId = reserved.asset.assetId;
  await api(ROUTES.completeUpload(assetId), { method: "POST", body: {} });
  state.assetId = assetId;
  $("upload-state").textContent = "Uploaded: ready to generate.";
  notify("");
}

// --- jobs -------------------------------------------------------------------------------

function showJob(job) {
  $("no-job").hidden = true;
  $("job").hidden = false;
  $("job-id").textContent = `job ${job.jobId} · version ${job.version}`;
  const status = $("job-status");
  status.textContent = label(job.status);
  status.className = `status ${label(job.status)}`;
  status.dataset.status = job.status;
  const progress = Number(job.progressPercent ?? 0);
  const finished = job.done || TERMINAL.has(job.status);
  // A job that ended ends its bar: full, in the colour of how it ended (a cancelled job's
  // last progress is no longer news).
  const bar = $("job-progress");
  bar.value = finished ? bar.max : progress;
  if (finished) {
    bar.dataset.state = label(job.status);
    bar.setAttribute("aria-valuetext", label(job.status));
  } else {
    delete bar.dataset.state;
    bar.setAttribute("aria-valuetext", `${progress} %`);
  }
  const details = [];
  if (!finished && job.step && job.step !== "JOB_STEP_UNSPECIFIED") details.push(job.step.replace(/^JOB_STEP_/, "").toLowerCase());
  if (job.status === "JOB_STATUS_RUNNING") details.push(`${progress} %`);
  if (job.cancelRequested && !TERMINAL.has(job.status)) details.push("cancelling…");
  if (job.error) details.push(errorText(job.error));
  $("job-detail").textContent = details.join(" · ");
  state.shown = job;
  showStanding(job);
  $("cancel").disabled = finished || Boolean(job.cancelRequested);
  const result = $("result");
  const url = job.outputs?.[0]?.url;
  if (url && result.dataset.url !== url) {
    result.dataset.url = url;
    result.src = url;
  }
  result.hidden = !url;
  if (!url) {
    result.removeAttribute("src");
    delete result.dataset.url;
  }
  const download = $("download");
  download.hidden = !url;
  if (url) {
    download.href = url;
    download.download = `atelier-${job.jobId}${extension(url)}`;
  } else {
    download.removeAttribute("href");
  }
}

/** Where a queued job stands: how many jobs a worker takes first, and when it should start
 * (Job.queuePosition, estimatedStartTime). The edge prints a position of 0 even when none
 * was read, so "next" is said only with an estimate. */
function showStanding(job) {
  const line = $("job-queue");
  const position = Number(job.queuePosition ?? 0);
  const parts = [];
  if (job.status === "JOB_STATUS_QUEUED") {
    if (position > 0) parts.push(position >= 1000 ? "1000 or more jobs ahead" : `${position} ${position === 1 ? "job" : "jobs"} ahead`);
    else if (job.estimatedStartTime) parts.push("next in line");
    if (job.estimatedStartTime) {
      const seconds = Math.max(0, Math.round((Date.parse(job.estimatedStartTime) - Date.now()) / 1000));
      parts.push(seconds < 2 ? "starting now" : `starts in about ${seconds} s`);
    }
  }
  line.textContent = parts.join(" · ");
  line.hidden = parts.length === 0;
  line.dataset.position = job.status === "JOB_STATUS_QUEUED" ? String(position) : "";
}

/** A KeepAlive's standings: the job on screen moved in the queue without a new version. */
function applyStandings(standings) {
  const job = state.shown;
  if (!job) return;
  for (const standing of standings ?? []) {
    if (standing.jobId === job.jobId && BigInt(standing.version ?? "0") === BigInt(job.version ?? "0")) {
      job.queuePosition = standing.queuePosition;
      job.estimatedStartTime = standing.estimatedStartTime;
      showStanding(job);
    }
  }
}

const EXTENSIONS = { "image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp" };

/** The file name's extension for a signed URL: local storage's URLs carry their type. */
function extension(url) {
  try {
    return EXTENSIONS[new URL(url, location.href).searchParams.get("type")] ?? "";
  } catch {
    return "";
  }
}

/** Follows a job's states on the watch stream until it is done, reconnecting after the
 * last version it saw when the stream ends early (a notify replica went away, draining).
 * A version is an int64, a JSON string: compared as a BigInt, never as text ("10" < "9"),
 * and an older or repeated one is ignored. */
async function watch(jobId, signal) {
  let afterVersion = 0n;
  let failures = 0;
  while (!signal.aborted) {
    try {
      const response = await call(ROUTES.watchJob(jobId, afterVersion), {
        token: state.token,
        signal,
        onBusy: busy,
      });
      for await (const message of jsonLines(response)) {
        if (signal.aborted) return;
        if (message.job) {
          failures = 0;
          const version = BigInt(message.job.version ?? "0");
          if (version <= afterVersion) continue;
          afterVersion = version;
          showJob(message.job);
          if (message.job.done) {
            await finished();
            return;
          }
        } else if (message.keepAlive) {
          applyStandings(message.keepAlive.standings);
        } else if (message.error) {
          throw new EdgeError(200, message.error, null);
        } else if (message.end) {
          // The server ends streams on purpose (draining, maximum duration): reconnect.
          await sleep(Number.parseFloat(message.end.retryDelay ?? "1") || 1);
          break;
        }
      }
    } catch (error) {
      if (error.name === "AbortError" || signal.aborted) return;
      failures += 1;
      if ((error instanceof EdgeError && !error.busy) || failures >= WATCH_FAILURES) throw error;
      busy();
      await sleep(1);
    }
  }
}

/** A job reached its end: the points and the history changed. */
async function finished() {
  await Promise.all([loadBalance(), loadHistory()]);
}

function follow(job) {
  state.watching?.abort();
  state.jobId = job.jobId;
  rememberJob(job.jobId);
  showJob(job);
  const controller = new AbortController();
  state.watching = controller;
  watch(job.jobId, controller.signal).catch(report);
}

async function submit() {
  const [width, height] = $("size").value.split("x").map(Number);
  const { job } = await api(ROUTES.submitJob(), {
    method: "POST",
    body: {
      requestId: newRequestId(), // the same on every retry: one job however often sent
      modelId: $("model").value,
      styleId: $("style").value,
      ...chosenPhoto(), // inputAssetId, inputUrl, or nothing for a prompt-only model
      prompt: $("prompt").value,
      width,
      height,
      parameters: chosenParameters(),
    },
  });
  notify("");
  follow(job);
  await Promise.all([loadBalance(), loadHistory()]);
}

async function cancel() {
  const { job } = await api(ROUTES.cancelJob(state.jobId), { method: "POST", body: {} });
  showJob(job);
}

async function open(jobId) {
  const { job } = await api(ROUTES.getJob(jobId));
  follow(job);
}

// --- wiring -----------------------------------------------------------------------------

function start() {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    action(event.submitter, () => signIn($("token").value));
  });
  $("sign-out").addEventListener("click", signOut);
  $("photo").addEventListener("change", () => {
    const file = $("photo").files[0];
    if (file) {
      action(null, () =>
        upload(file).catch((error) => {
          $("upload-state").textContent = "The upload failed.";
          throw error;
        }),
      );
    }
  });
  $("photo-url").addEventListener("input", updateSubmit);
  // Enter in the address field must not reload the page: the address goes with Generate.
  $("upload-form").addEventListener("submit", (event) => event.preventDefault());
  $("model").addEventListener("change", () => {
    showParameters();
    updateSubmit();
  });
  $("job-form").addEventListener("submit", (event) => {
    event.preventDefault();
    action($("submit"), submit);
  });
  $("cancel").addEventListener("click", () => action($("cancel"), cancel));
  $("refresh").addEventListener("click", () => action($("refresh"), () => Promise.all([loadBalance(), loadHistory()])));
  // A token in the fragment (#token=…, never sent to a server) or kept by this tab; the
  // job that was on screen (#job=…), shown again once signed in.
  const fragment = new URLSearchParams(location.hash.slice(1));
  const fromFragment = fragment.get("token");
  state.pendingJob = fragment.get("job") ?? "";
  if (fromFragment) rememberJob(state.pendingJob);
  const token = fromFragment || sessionStorage.getItem(TOKEN_KEY);
  if (token) {
    $("token").value = token;
    action(null, () => signIn(token));
  }
  document.body.dataset.ready = "true";
}

start();
