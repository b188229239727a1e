// The console's core: calling the API, showing messages and confirmations, the login form,
// and routing between pages (`#/page/argument`). The pages themselves are in pages.js.
//
// Every value from the server goes into the page as text (textContent), never as HTML.

import { pages } from "./pages.js";

// Calls the API; resolves to the answer's JSON, or throws an Error whose message is the
// server's readable error (with the refusing server's status, e.g. ACCESS_DENIED).
export async function api(method, path, body) {
  const options = { method, headers: {} };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch("/api" + path, options);
  } catch (error) {
    throw new Error("the console server did not answer (" + error.message + ")");
  }
  const text = await response.text();
  let answer = null;
  try {
    answer = JSON.parse(text);
  } catch (error) {
    answer = { error: "the console server answered " + response.status + ": " + text };
  }
  if (!response.ok) {
    const error = new Error(answer && answer.error ? answer.error : "HTTP " + response.status);
    error.status = answer ? answer.status : null;
    error.httpStatus = response.status;
    throw error;
  }
  return answer;
}

// Makes an element: el("td", {class: "num"}, "12", child, …). Strings become text nodes.
export function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    // Through the CSSOM: the content security policy refuses style attributes.
    else if (name === "style") node.style.cssText = value;
    else if (value === true) node.setAttribute(name, "");
    else node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A table with a header row and one row per item; `columns` are [title, item => cell, class].
export function table(id, columns, items, rowAttributes) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, columns.map(([title]) => el("th", {}, title)))),
    el("tbody", {}, items.map((item) =>
      el("tr", rowAttributes ? rowAttributes(item) : {},
        columns.map(([, cell, cls]) => el("td", cls ? { class: cls } : {}, cell(item)))))));
}

// Shows a message above the page: an error (red) or a success (green).
export function showMessage(text, isError) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = isError ? "error" : "ok";
  box.hidden = false;
}

export function clearMessage() {
  document.getElementById("message").hidden = true;
}

// Shows an error; a refusal by access control also opens the login form.
export function showError(error, what) {
  const status = error.status ? " [" + error.status + "]" : "";
  showMessage((what ? what + ": " : "") + error.message + status, true);
  if (error.status === "ACCESS_DENIED" || error.status === "NO_PERMISSION") {
    showMessage((what ? what + ": " : "") + error.message + status +
      "\nThe account may not do this; log in with another access key.", true);
    document.getElementById("login-form").hidden = false;
  }
}

// Asks to confirm a dangerous action in the page; with `expected`, the user must type it.
// Resolves to true when confirmed.
export function confirmAction(question, expected) {
  const box = document.getElementById("confirm");
  const input = document.getElementById("confirm-input");
  document.getElementById("confirm-question").textContent = question;
  document.getElementById("confirm-typing").hidden = !expected;
  document.getElementById("confirm-expected").textContent = expected || "";
  input.value = "";
  box.hidden = false;
  box.scrollIntoView({ block: "nearest" });
  return new Promise((resolve) => {
    const finish = (answer) => {
      box.hidden = true;
      yes.removeEventListener("click", onYes);
      no.removeEventListener("click", onNo);
      resolve(answer);
    };
    const yes = document.getElementById("confirm-yes");
    const no = document.getElementById("confirm-no");
    const onYes = () => {
      if (expected && input.value !== expected) {
        showMessage("type " + expected + " exactly to confirm", true);
        return;
      }
      finish(true);
    };
    const onNo = () => finish(false);
    yes.addEventListener("click", onYes);
    no.addEventListener("click", onNo);
  });
}

// Timers of the page shown now; cleared when the page changes.
let timers = [];

export function every(ms, action) {
  timers.push(setInterval(action, ms));
}

// A time in ms since the epoch as local text.
export function time(ms) {
  return ms > 0 ? new Date(ms).toLocaleString() : "-";
}

export function bytes(count) {
  if (count === null || count === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return (unit === 0 ? value : value.toFixed(1)) + " " + units[unit];
}

export function duration(ms) {
  const seconds = Math.floor(ms / 1000);
  const days = Math.floor(seconds / 86400);
  const hours = Math.floor((seconds % 86400) / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  if (days > 0) return days + "d " + hours + "h";
  if (hours > 0) return hours + "h " + minutes + "m";
  return minutes + "m " + (seconds % 60) + "s";
}

// Whether the account this browser works as may make admin calls (create, update and delete
// topics): true or false as the broker said when the console's connection authenticated, null
// when unknown (no access control, no account, or no broker reachable): then every control is
// shown and the servers decide.
let accountMayAdmin = null;
export function mayAdmin() {
  return accountMayAdmin;
}

async function refreshAccount() {
  try {
    const session = await api("GET", "/session");
    accountMayAdmin = typeof session.may_admin === "boolean" ? session.may_admin : null;
    const account = session.account || session.default_account;
    document.getElementById("account").textContent = session.account
      ? "logged in as " + session.account
      : account ? "as " + account + " (command line)" : "no account";
    document.getElementById("logout").hidden = !session.account;
    document.getElementById("login-open").hidden = Boolean(session.account);
  } catch (error) {
    accountMayAdmin = null;
    document.getElementById("account").textContent = "session unknown";
  }
}

function setUpLogin() {
  const form = document.getElementById("login-form");
  document.getElementById("login-open").addEventListener("click", () => {
    form.hidden = false;
    document.getElementById("login-key").focus();
  });
  document.getElementById("login-cancel").addEventListener("click", () => { form.hidden = true; });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const secret = document.getElementById("login-secret");
    try {
      const answer = await api("POST", "/login", {
        access_key: document.getElementById("login-key").value,
        secret_key: secret.value,
      });
      secret.value = "";
      form.hidden = true;
      showMessage("logged in as " + answer.account, false);
      await refreshAccount();
      route();
    } catch (error) {
      secret.value = "";
      showError(error, "login refused");
    }
  });
  document.getElementById("logout").addEventListener("click", async () => {
    try {
      await api("POST", "/logout");
      showMessage("logged out", false);
    } catch (error) {
      showError(error, "logout");
    }
    await refreshAccount();
    route();
  });
}

// Shows the page the location's hash names.
async function route() {
  timers.forEach(clearInterval);
  timers = [];
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const page = pages[name] ? name : "cluster";
  const argument = rest.length ? decodeURIComponent(rest.join("/")) : null;
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  const main = document.getElementById("page");
  main.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  main.dataset.page = page;
  try {
    await pages[page](main, argument);
  } catch (error) {
    main.replaceChildren(el("h1", {}, page), el("p", { class: "error-text" }, error.message));
    showError(error);
  }
}

window.addEventListener("hashchange", () => { clearMessage(); route(); });
setUpLogin();
refreshAccount().then(route);
