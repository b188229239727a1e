// The console's pages: each is a function that fills <main> from the API and wires its forms.

import {
  api, el, table, showMessage, showError, clearMessage, confirmAction, every, time, bytes,
  duration, mayAdmin,
} from "./app.js";
import { drawChart } from "./chart.js";

const COLORS = ["#2f6fdb", "#e8590c", "#0ca678", "#ae3ec9", "#f59f00", "#1098ad"];

// Runs `action` and shows its error instead of throwing (for buttons and timers).
async function guarded(what, action) {
  try {
    return await action();
  } catch (error) {
    showError(error, what);
    return undefined;
  }
}

// What stands instead of a form the account may not use (it is not an admin account).
function needsAdmin(id, what) {
  return el("p", { class: "muted", id }, what + " needs an admin account; this account is not " +
    "one (log in with another access key).");
}

// Replaces `node`'s children with `children` (arrays flattened, null and undefined left out).
function fill(node, ...children) {
  node.replaceChildren(...children.flat(2).filter((child) => child !== null && child !== undefined));
}

function failuresNote(failures) {
  if (!failures || failures.length === 0) return null;
  return el("p", { class: "error-text failures" },
    failures.map((f) => "broker " + f.address + " did not answer: " + f.error).join("\n"));
}

function value(id) {
  return document.getElementById(id).value.trim();
}

function permText(perm) {
  if (perm === null || perm === undefined) return "-";
  const parts = [];
  if (perm & 4) parts.push("read");
  if (perm & 2) parts.push("write");
  return parts.length ? parts.join("+") + " (" + perm + ")" : "none (" + perm + ")";
}

const permOptions = () => [
  el("option", { value: "6" }, "read + write (6)"),
  el("option", { value: "4" }, "read only (4)"),
  el("option", { value: "2" }, "write only (2)"),
];

// ---------------------------------------------------------------------------------------------
// Cluster

async function cluster(main) {
  const render = async () => {
    const data = await api("GET", "/cluster");
    const brokers = data.brokers;
    const diskUse = (s) => s.disk_total_bytes
      ? bytes(s.disk_total_bytes - s.disk_free_bytes) + " of " + bytes(s.disk_total_bytes) + " (" +
        (100 * (s.disk_total_bytes - s.disk_free_bytes) / s.disk_total_bytes).toFixed(0) + " %)"
      : "-";
    const replication = (b) => {
      if (!b.status) return "-";
      const shards = (b.status.replication || []).filter((r) => r.peer !== "");
      if (shards.length === 0) {
        return b.status.role.endsWith("master") ? "no slave replicating" : "-";
      }
      return shards.map((r) => "shard " + r.storage_shard + ": " + (r.peer || "-") +
        ", epoch " + r.epoch + ", " + (r.connected ? "connected" : "not connected") +
        (r.lag_bytes === null ? ", lag unknown"
          : r.lag_bytes === 0 ? ", in sync" : ", " + bytes(r.lag_bytes) + " behind") +
        (r.lag_ms ? " (" + r.lag_ms + " ms)" : "")).join("; ");
    };
    const children = [
      el("h1", {}, "Cluster"),
      el("p", { class: "muted" }, "Name server " + data.namesrv + ": " + data.clusters.length +
        " cluster(s), " + brokers.length + " broker instance(s). Refreshed every 5 s."),
      table("brokers", [
        ["State", (b) => el("span", { class: b.is_up ? "up state" : "down state" },
          b.is_up ? "up" : "down")],
        ["Cluster", (b) => b.cluster_name],
        ["Broker", (b) => b.broker_name],
        ["Id", (b) => String(b.broker_id), "num"],
        ["Address", (b) => b.address],
        ["Role", (b) => b.status ? b.status.role : (b.is_master ? "master" : "slave")],
        ["Version", (b) => b.status ? b.status.version : "-"],
        ["Uptime", (b) => b.status ? duration(b.status.uptime_ms) : "-"],
        ["Disk used", (b) => b.status ? diskUse(b.status) : "-"],
        ["CommitLog", (b) => b.status ? bytes(b.status.commitlog_bytes) : "-", "num"],
        ["Topics", (b) => b.status ? String(b.status.topics) : "-", "num"],
        ["Connections", (b) => b.status ? String(b.status.connections) : "-", "num"],
        ["Shards", (b) => b.status
          ? b.status.storage_shards + " storage / " + b.status.network_shards + " network" : "-"],
        ["Replication", replication],
        ["Error", (b) => b.error ? el("span", { class: "error-text" }, b.error) : ""],
      ], brokers, (b) => ({ "data-address": b.address, "data-state": b.is_up ? "up" : "down" })),
    ];
    children.push(el("h2", {}, "Controller"));
    if (!data.controller) {
      children.push(el("p", { class: "muted", id: "controller" },
        "No controller configured (start the console with --controller ADDR to show the " +
        "controller's leader, term and each broker group's master, epoch and in-sync replicas)."));
    } else if (data.controller.error) {
      children.push(el("p", { class: "error-text", id: "controller" }, data.controller.error));
    } else {
      const c = data.controller.status;
      children.push(el("p", { id: "controller" }, "Answered by " + c.address + " (node " +
        c.node_id + "); leader node " + c.leader_id + ", term " + c.term + ", members " +
        c.members.join(", ")));
      children.push(table("controller-groups", [
        ["Cluster", (g) => g.cluster_name],
        ["Broker", (g) => g.broker_name],
        ["Master", (g) => g.master_id + " at " + g.master_address],
        ["Epoch", (g) => String(g.epoch), "num"],
        ["In sync (SyncStateSet)", (g) => g.sync_state_set.join(", ")],
        ["Alive", (g) => g.alive.join(", ")],
      ], c.groups));
    }
    fill(main, ...children);
  };
  await render();
  every(5000, () => guarded("cluster", render));
}

// ---------------------------------------------------------------------------------------------
// Topics

async function topics(main, name) {
  const showSystem = name === "/system";
  if (name && !showSystem) return topic(main, name);
  const data = await api("GET", "/topics" + (showSystem ? "?system=true" : ""));
  const form = el("form", { class: "inline panel", id: "create-topic" },
    el("label", {}, "Topic", el("input", { id: "create-topic-name", required: true,
      pattern: "[%|a-zA-Z0-9_\\-]+", placeholder: "OrderEvents" })),
    el("label", {}, "Queues per broker", el("input", { id: "create-topic-queues", type: "number",
      min: 1, max: 1024, value: 8 })),
    el("label", {}, "Permission", el("select", { id: "create-topic-perm" }, permOptions())),
    el("label", {}, "Ordered", el("input", { id: "create-topic-ordered", type: "checkbox" })),
    el("label", {}, "Broker (default: every master)", el("input", { id: "create-topic-broker",
      placeholder: "host:port" })),
    el("button", { id: "create-topic-submit", type: "submit" }, "Create topic"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded("create topic", async () => {
      const answer = await api("POST", "/topics", {
        topic: value("create-topic-name"),
        queues: Number(value("create-topic-queues")),
        perm: Number(value("create-topic-perm")),
        ordered: document.getElementById("create-topic-ordered").checked,
        broker: value("create-topic-broker"),
      });
      const failed = answer.failures.map((f) => "; " + f.address + " failed: " + f.error).join("");
      showMessage("created topic " + answer.topic.name + " on " + answer.brokers.join(", ") +
        failed, answer.failures.length > 0);
      await topics(main, null);
    });
  });
  fill(main, 
    el("h1", {}, "Topics"),
    el("h2", {}, "Create a topic"),
    mayAdmin() === false ? needsAdmin("create-topic-denied", "Creating a topic") : form,
    el("h2", {}, data.topics.length + " topic(s)",
      el("a", { href: showSystem ? "#/topics" : "#/topics//system", class: "muted",
        style: "margin-left: 12px; font-size: 12px" },
      showSystem ? "hide system topics" : "show system topics")),
    table("topic-list", [
      ["Topic", (t) => el("a", { href: "#/topics/" + encodeURIComponent(t) }, t)],
    ], data.topics, (t) => ({ "data-topic": t })));
}

async function topic(main, name) {
  let lastSample = null;
  const render = async () => {
    const data = await api("GET", "/topics/" + encodeURIComponent(name));
    const queues = data.stats ? data.stats.queues : [];
    const total = queues.reduce((sum, q) => sum + q.max_offset, 0);
    const now = Date.now();
    let rate = "measured at the next refresh (every 5 s)";
    if (lastSample && data.stats) {
      rate = ((total - lastSample.total) / ((now - lastSample.at) / 1000)).toFixed(1) +
        " messages/s over the last " + ((now - lastSample.at) / 1000).toFixed(0) + " s";
    }
    if (data.stats) lastSample = { total, at: now };
    const firstRoute = data.route.brokers[0] || {};
    const update = el("form", { class: "inline panel", id: "update-topic" },
      el("label", {}, "Read queues", el("input", { id: "update-read-queues", type: "number",
        min: 1, max: 1024, value: firstRoute.read_queues || 8 })),
      el("label", {}, "Write queues", el("input", { id: "update-write-queues", type: "number",
        min: 1, max: 1024, value: firstRoute.write_queues || 8 })),
      el("label", {}, "Permission", el("select", { id: "update-perm" }, permOptions())),
      el("button", { id: "update-submit", type: "submit" }, "Update on every master"));
    update.querySelector("select").value = String(firstRoute.perm || 6);
    update.addEventListener("submit", (event) => {
      event.preventDefault();
      guarded("update topic", async () => {
        const answer = await api("POST", "/topics", {
          topic: name, update: true,
          read_queues: Number(value("update-read-queues")),
          write_queues: Number(value("update-write-queues")),
          queues: Number(value("update-write-queues")),
          perm: Number(value("update-perm")),
        });
        showMessage("updated topic " + name + " on " + answer.brokers.join(", "), false);
        await render();
      });
    });
    const remove = el("button", { id: "delete-topic", type: "button", class: "danger" },
      "Delete topic");
    remove.addEventListener("click", () => guarded("delete topic", async () => {
      const isSystem = name.startsWith("%RETRY%") || name.startsWith("%DLQ%");
      if (!await confirmAction("Delete topic " + name + " on every master broker hosting it? " +
        "Its stored messages are no longer served.", name)) return;
      const answer = await api("DELETE", "/topics/" + encodeURIComponent(name) +
        (isSystem ? "?force=true" : ""));
      location.hash = "#/topics";
      showMessage("deleted topic " + name + " on " + answer.deleted_on.join(", "), false);
    }));
    fill(main, 
      el("h1", {}, "Topic ", el("span", { id: "topic-name" }, name)),
      el("p", {}, el("a", { href: "#/topics" }, "← all topics"), " · ",
        el("a", { href: "#/messages//" + encodeURIComponent(name) }, "browse its messages")),
      el("h2", {}, "Route"),
      table("topic-route", [
        ["Broker", (b) => b.broker_name],
        ["Cluster", (b) => b.cluster_name],
        ["Addresses", (b) => b.addresses.map((a) => a.broker_id + "=" + a.address).join(", ")],
        ["Read queues", (b) => String(b.read_queues), "num"],
        ["Write queues", (b) => String(b.write_queues), "num"],
        ["Permission", (b) => permText(b.perm)],
      ], data.route.brokers),
      el("h2", {}, "Queues"),
      el("p", { id: "produce-rate" }, "Produce rate: " + rate),
      data.stats_error ? el("p", { class: "error-text" }, "Queue offsets unavailable: " +
        data.stats_error) : null,
      table("topic-queues", [
        ["Broker", (q) => q.broker_name],
        ["Queue", (q) => String(q.queue_id), "num"],
        ["Min offset", (q) => String(q.min_offset), "num"],
        ["Max offset", (q) => String(q.max_offset), "num"],
        ["Messages", (q) => String(q.max_offset - q.min_offset), "num"],
        ["Last stored", (q) => time(q.last_update_ms)],
      ], queues, (q) => ({ "data-queue": q.broker_name + "#" + q.queue_id })),
      el("h2", {}, "Update queues and permission"),
      mayAdmin() === false ? needsAdmin("update-topic-denied", "Updating a topic") : update,
      el("h2", {}, "Delete"),
      mayAdmin() === false ? needsAdmin("delete-topic-denied", "Deleting a topic") : remove);
  };
  await render();
  every(5000, () => {
    if (document.getElementById("confirm").hidden &&
        !document.activeElement.closest("form")) guarded("topic", render);
  });
}

// ---------------------------------------------------------------------------------------------
// Consumer groups

async function groups(main, name) {
  if (name) return group(main, name);
  const data = await api("GET", "/groups");
  fill(main, 
    el("h1", {}, "Consumer groups"),
    failuresNote(data.failures),
    el("p", { class: "muted" }, data.groups.length + " group(s) known to the master brokers."),
    table("group-list", [
      ["Group", (g) => el("a", { href: "#/groups/" + encodeURIComponent(g.group) }, g.group)],
      ["Live members", (g) => String(g.members), "num"],
      ["Lag", (g) => String(g.lag), "num"],
      ["Topics", (g) => g.topics.join(", ")],
    ], data.groups, (g) => ({ "data-group": g.group })));
}

async function group(main, name) {
  let lastSample = null;
  let resetResult = null;
  const render = async () => {
    const data = await api("GET", "/groups/" + encodeURIComponent(name));
    const committed = data.queues.reduce((sum, q) => sum + (q.committed_offset || 0), 0);
    const now = Date.now();
    let rate = "measured at the next refresh (every 5 s)";
    if (lastSample) {
      rate = (Math.max(0, committed - lastSample.committed) / ((now - lastSample.at) / 1000))
        .toFixed(1) + " messages/s committed over the last " +
        ((now - lastSample.at) / 1000).toFixed(0) + " s";
    }
    lastSample = { committed, at: now };
    const topicsOfGroup = [...new Set(data.queues.map((q) => q.topic))];
    const reset = el("form", { class: "inline panel", id: "reset-form" },
      el("label", {}, "Topic", el("select", { id: "reset-topic" },
        topicsOfGroup.map((t) => el("option", { value: t }, t)))),
      el("label", {}, "Move to", el("select", { id: "reset-to" },
        el("option", { value: "time" }, "a time"),
        el("option", { value: "first" }, "the first message"),
        el("option", { value: "last" }, "the end (skip all)"))),
      el("label", {}, "Time (RFC 3339 or ms since the epoch)", el("input", { id: "reset-time",
        size: 28, value: new Date(Date.now() - 3600000).toISOString().replace(/\.\d+Z$/, "Z") })),
      el("label", {}, "Even with live members", el("input", { id: "reset-force",
        type: "checkbox" })),
      el("button", { id: "reset-submit", type: "submit", class: "danger" }, "Reset offsets"));
    reset.addEventListener("submit", (event) => {
      event.preventDefault();
      guarded("reset offsets", async () => {
        const topicName = value("reset-topic");
        const mode = value("reset-to");
        const to = mode === "time" ? value("reset-time") : mode;
        if (!await confirmAction("Move the committed offsets of group " + name + " on every " +
          "queue of " + topicName + " to " + to + "? Its consumers should be stopped first: a " +
          "running consumer commits its own position over the reset.")) return;
        const answer = await api("POST", "/groups/" + encodeURIComponent(name) + "/reset", {
          topic: topicName, to, force: document.getElementById("reset-force").checked,
        });
        resetResult = answer.queues;
        showMessage("reset group " + name + " on " + answer.queues.length + " queue(s) of " +
          topicName, false);
        await render();
      });
    });
    fill(main, 
      el("h1", {}, "Consumer group ", el("span", { id: "group-name" }, name)),
      el("p", {}, el("a", { href: "#/groups" }, "← all groups"), " · ",
        el("a", { href: "#/dlq/" + encodeURIComponent(name) }, "its dead letters")),
      failuresNote(data.failures),
      el("h2", {}, "Members"),
      el("div", { id: "group-members" }, data.members.map((m) => el("p", {},
        el("b", {}, m.topic + ": "),
        m.error ? el("span", { class: "error-text" }, m.error)
          : m.members.length ? m.members.join(", ") : el("span", { class: "muted" },
            "no live member")))),
      el("h2", {}, "Queue assignment"),
      data.members.every((m) => !(m.assignment || []).length)
        ? el("p", { id: "group-assignment", class: "muted" }, "no live member")
        : table("group-assignment", [
          ["Topic", (a) => a.topic],
          ["Member", (a) => a.client_id],
          ["Queues held", (a) => a.queues === null
            ? el("span", { class: "muted" }, "not reported")
            : a.queues.length ? a.queues.map((q) => q.broker_name + "#" + q.queue_id).join(", ")
              : el("span", { class: "muted" }, "none")],
        ], data.members.flatMap((m) => (m.assignment || []).map((a) => ({ topic: m.topic, ...a }))),
        (a) => ({ "data-member": a.topic + " " + a.client_id })),
      el("p", { class: "muted" }, "As each member reported in its last heartbeat (sent when " +
        "its queues change, and every 30 s); \"not reported\": a client that does not say " +
        "(older clients, pull and RocketMQ consumers)."),
      el("h2", {}, "Progress"),
      el("p", { id: "consume-rate" }, "Total lag " + data.total_lag + ". Consume rate: " + rate),
      table("group-queues", [
        ["Topic", (q) => q.topic],
        ["Broker", (q) => q.broker_name],
        ["Queue", (q) => String(q.queue_id), "num"],
        ["Committed", (q) => q.committed_offset === null ? "-" : String(q.committed_offset),
          "num"],
        ["Max offset", (q) => String(q.max_offset), "num"],
        ["Lag", (q) => String(q.lag), "num"],
      ], data.queues, (q) => ({ "data-queue": q.topic + "@" + q.broker_name + "#" + q.queue_id })),
      el("h2", {}, "Reset offsets"),
      reset,
      resetResult ? table("reset-result", [
        ["Topic", (r) => r.topic],
        ["Broker", (r) => r.broker_name],
        ["Queue", (r) => String(r.queue_id), "num"],
        ["Before", (r) => r.previous_offset === null ? "-" : String(r.previous_offset), "num"],
        ["Now", (r) => String(r.offset), "num"],
      ], resetResult) : null);
  };
  await render();
  every(5000, () => {
    if (document.getElementById("confirm").hidden &&
        !document.activeElement.closest("form")) guarded("group", render);
  });
}

// ---------------------------------------------------------------------------------------------
// Messages

function hexView(hex) {
  const lines = [];
  for (let i = 0; i < hex.length; i += 32) {
    const chunk = hex.slice(i, i + 32);
    lines.push((i / 2).toString(16).padStart(8, "0") + "  " + chunk.replace(/(..)/g, "$1 "));
  }
  return lines.join("\n");
}

function bodyIn(view, message) {
  if (view === "hex") return hexView(message.body_hex);
  if (view === "json") {
    try {
      return JSON.stringify(JSON.parse(message.body), null, 2);
    } catch (error) {
      return "(not JSON: " + error.message + ")";
    }
  }
  return message.body;
}

// One stored message: metadata, properties, the body as text, JSON or hex, and a resend.
export function messageCard(message, onResend) {
  const body = el("pre", { class: "body" }, message.body);
  const views = el("span", { class: "views" });
  for (const view of ["text", "json", "hex"]) {
    const button = el("button", { type: "button", "data-view": view,
      class: view === "text" ? "selected" : null }, view.toUpperCase());
    button.addEventListener("click", () => {
      body.textContent = bodyIn(view, message);
      body.dataset.view = view;
      for (const other of views.children) other.classList.toggle("selected", other === button);
    });
    views.append(button);
  }
  const resend = el("button", { type: "button", class: "resend" },
    "Resend to " + (message.resend_topic || "?"));
  resend.disabled = !message.resend_topic;
  resend.addEventListener("click", () => guarded("resend", () => onResend(message)));
  const row = (name, text) => [el("span", { class: "muted" }, name), el("span", {}, text)];
  const properties = Object.entries(message.all_properties);
  return el("div", { class: "message", "data-msg-id": message.msg_id },
    el("div", { class: "meta" },
      row("msg id", el("code", { class: "msg-id" }, message.msg_id)),
      row("topic", message.topic + " @ " + message.broker_name + " queue " + message.queue_id +
        " offset " + message.queue_offset),
      row("tag", message.tags || "-"),
      row("keys", message.keys.length ? message.keys.join(", ") : "-"),
      row("born", time(message.born_timestamp_ms) + " from " + message.born_host),
      row("stored", time(message.store_timestamp_ms) + " at " + message.store_host +
        " (CommitLog offset " + message.commit_log_offset + ")"),
      row("reconsumed", String(message.reconsume_times)),
      message.retry_topic ? row("original topic", message.retry_topic) : null,
      row("body", message.body_bytes + " bytes" + (message.body_is_truncated
        ? " (first " + (message.body_hex.length / 2) + " shown)" : ""))),
    properties.length ? table(null, [["Property", ([k]) => k], ["Value", ([, v]) => v]],
      properties) : null,
    el("div", {}, views, " ", resend),
    body);
}

async function resendMessage(message) {
  if (!await confirmAction("Send message " + message.msg_id + " again to topic " +
    message.resend_topic + "? Every group subscribed to it receives the copy.")) return;
  const answer = await api("POST", "/messages/resend", { id: message.msg_id,
    topic: message.topic });
  const sent = answer.resent[0];
  showMessage("resent " + message.msg_id + " to " + sent.topic + " as " + sent.msg_id +
    " (queue " + sent.queue_id + ", offset " + sent.queue_offset + ")", false);
}

function showResults(container, answer, what) {
  const list = answer.messages;
  fill(container, 
    failuresNote(answer.failures),
    el("p", { id: "result-count" }, list.length + " message(s) " + what),
    list.map((m) => messageCard(m, resendMessage)));
}

// `#/messages//TOPIC` fills in the topic; `#/messages/id/ID` and `#/messages/key/TOPIC/KEY`
// run that query (links and scripts use them).
async function messages(main, argument) {
  const [kind, first, second] = argument ? argument.split("/") : [];
  const topicGiven = kind === "" ? first || "" : kind === "key" ? first || "" : "";
  const results = el("div", { id: "results" });
  const form = (id, title, fields, submit) => {
    const node = el("form", { class: "inline panel", id },
      el("b", { style: "width: 100%" }, title), fields,
      el("button", { id: id + "-submit", type: "submit" }, "Search"));
    node.addEventListener("submit", (event) => {
      event.preventDefault();
      clearMessage();
      guarded(title, submit);
    });
    return node;
  };
  const rangeOrTime = (prefix) => [
    el("label", {}, "Stored from (optional)", el("input", { id: prefix + "-begin",
      placeholder: "2026-12-07T08:00:00Z" })),
    el("label", {}, "Stored until (optional)", el("input", { id: prefix + "-end" })),
  ];
  const query = (params) => new URLSearchParams(Object.entries(params)
    .filter(([, v]) => v !== "")).toString();
  fill(main, 
    el("h1", {}, "Messages"),
    form("query-id", "By message id (unique id or offset id)", [
      el("label", {}, "Message id", el("input", { id: "query-id-value", size: 36, required: true })),
      el("label", {}, "Topic (optional)", el("input", { id: "query-id-topic" })),
    ], async () => {
      const answer = await api("GET", "/messages/id?" + query({ id: value("query-id-value"),
        topic: value("query-id-topic") }));
      showResults(results, answer, "with id " + value("query-id-value"));
    }),
    form("query-key", "By key", [
      el("label", {}, "Topic", el("input", { id: "query-key-topic", required: true,
        value: topicGiven })),
      el("label", {}, "Key", el("input", { id: "query-key-value", required: true })),
      ...rangeOrTime("query-key"),
    ], async () => {
      const answer = await api("GET", "/messages/key?" + query({ topic: value("query-key-topic"),
        key: value("query-key-value"), begin: value("query-key-begin"),
        end: value("query-key-end") }));
      showResults(results, answer, "with key " + value("query-key-value"));
    }),
    form("query-range", "By queue and offset (or time)", [
      el("label", {}, "Topic", el("input", { id: "range-topic", required: true,
        value: topicGiven })),
      el("label", {}, "Broker name (if several)", el("input", { id: "range-broker" })),
      el("label", {}, "Queue id", el("input", { id: "range-queue", type: "number", min: 0,
        value: 0, required: true })),
      el("label", {}, "From offset", el("input", { id: "range-from", type: "number", min: 0 })),
      el("label", {}, "or from time", el("input", { id: "range-time",
        placeholder: "2026-12-07T08:00:00Z" })),
      el("label", {}, "Count (≤ 100)", el("input", { id: "range-count", type: "number", min: 1,
        max: 100, value: 20 })),
    ], async () => {
      const answer = await api("GET", "/messages/range?" + query({
        topic: value("range-topic"), broker: value("range-broker"), queue: value("range-queue"),
        from: value("range-from"), time: value("range-time"), count: value("range-count") }));
      showResults(results, answer, "of " + answer.topic + " @ " + answer.broker_name +
        " queue " + answer.queue_id + " from offset " + answer.start_offset + " (queue holds " +
        answer.min_offset + " to " + answer.max_offset + ")");
    }),
    results);
  if (kind === "id" && first) {
    document.getElementById("query-id-value").value = first;
    document.getElementById("query-id-submit").click();
  } else if (kind === "key" && first && second) {
    document.getElementById("query-key-value").value = second;
    document.getElementById("query-key-submit").click();
  }
}

// ---------------------------------------------------------------------------------------------
// Dead letters

async function dlq(main, name) {
  const results = el("div", { id: "dlq-results" });
  const form = el("form", { class: "inline panel", id: "dlq-form" },
    el("label", {}, "Consumer group", el("input", { id: "dlq-group", required: true,
      value: name || "" })),
    el("button", { id: "dlq-submit", type: "submit" }, "Show dead letters"));
  const load = async (group) => {
    const answer = await api("GET", "/dlq/" + encodeURIComponent(group));
    const letters = answer.dead_letters;
    const all = el("button", { id: "dlq-resend-all", type: "button", class: "danger" },
      "Resend all " + letters.length + " to their topics");
    all.disabled = letters.length === 0;
    all.addEventListener("click", () => guarded("resend dead letters", async () => {
      if (!await confirmAction("Send all " + letters.length + " dead letters of " + group +
        " again to the topics they were first sent to? They stay in %DLQ%" + group + ".")) return;
      const done = await api("POST", "/dlq/" + encodeURIComponent(group) + "/resend",
        { all: true });
      const sent = done.resent.filter((r) => !r.error).length;
      showMessage("resent " + sent + " dead letter(s)" + (done.errors.length
        ? "; failed: " + done.errors.join("; ") : ""), done.errors.length > 0);
    }));
    const resendOne = async (letter) => {
      if (!await confirmAction("Send dead letter " + letter.msg_id + " again to " +
        letter.resend_topic + "?")) return;
      const done = await api("POST", "/dlq/" + encodeURIComponent(group) + "/resend",
        { id: letter.msg_id });
      if (done.errors.length) throw new Error(done.errors.join("; "));
      showMessage("resent dead letter " + letter.msg_id + " to " + done.resent[0].topic, false);
    };
    fill(results, 
      el("p", { id: "dlq-count" }, letters.length + " dead letter(s) in %DLQ%" + group),
      all,
      letters.map((letter) => messageCard(letter, resendOne)));
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded("dead letters", () => load(value("dlq-group")));
  });
  fill(main, el("h1", {}, "Dead letters"), form, results);
  if (name) await load(name);
}

// ---------------------------------------------------------------------------------------------
// Metrics

// How often the metrics page asks for the console's samples.
const METRICS_REFRESH_MS = 2000;

function metricsChart(id, title, unit) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.id = id;
  return el("div", { class: "chart" }, el("b", {}, title),
    el("span", { class: "muted" }, " (" + unit + ")"), svg,
    el("div", { class: "legend", id: id + "-legend" }));
}

// Per broker, [at_ms, value per second] between consecutive samples of `field`.
function rates(broker, field) {
  const points = [];
  for (let i = 1; i < broker.samples.length; i += 1) {
    const [a, b] = [broker.samples[i - 1], broker.samples[i]];
    const seconds = (b.uptime_ms - a.uptime_ms) / 1000;
    if (seconds <= 0) continue; // the broker restarted: its counters began again
    points.push([b.at_ms, Math.max(0, b[field] - a[field]) / seconds]);
  }
  return points;
}

async function metrics(main) {
  const status = el("p", { id: "metrics-status", class: "muted" }, "Loading…");
  fill(main,
    el("h1", {}, "Metrics"),
    status,
    el("div", { class: "charts" },
      metricsChart("chart-in", "Produce rate", "messages/s stored"),
      metricsChart("chart-out", "Consume rate", "messages/s pulled"),
      metricsChart("chart-bytes-in", "Produce throughput", "bytes/s stored"),
      metricsChart("chart-lag", "Replication lag", "bytes a slave lacks"),
      metricsChart("chart-send-p50", "Send latency p50", "µs, bucket upper bound"),
      metricsChart("chart-send-p90", "Send latency p90", "µs, bucket upper bound"),
      metricsChart("chart-send-p99", "Send latency p99", "µs, bucket upper bound")),
    el("p", { class: "muted", id: "metrics-note" }));
  const render = async () => {
    const data = await api("GET", "/metrics");
    document.getElementById("metrics-note").textContent = "The console samples every " +
      "broker's counters every " + data.interval_ms / 1000 + " s while it runs (as its own " +
      "account, the one given on its command line) and keeps the last " +
      data.history_ms / 60000 + " minutes; rates are the change between two samples. Send " +
      "latency percentiles are over the sends between two samples, each estimated as the " +
      "upper bound of its latency histogram bucket (the bounds double from 50 µs), so they " +
      "overstate by up to 2×; the legend adds them over the whole window. Pull latency is " +
      "not shown.";
    const draw = (id, lines, format) => {
      drawChart(document.getElementById(id), lines, data.history_ms, data.now_ms);
      document.getElementById(id + "-legend").replaceChildren(...lines.map((line) => {
        const last = line.points.length ? line.points[line.points.length - 1][1] : null;
        return el("span", { style: "color:" + line.color }, "■ " + line.name + ": " +
          (last === null ? "-" : format(last)));
      }));
    };
    const lines = (points) => data.brokers.map((broker, index) => ({
      name: broker.name + " " + broker.address,
      color: COLORS[index % COLORS.length],
      points: points(broker),
    }));
    const perSecond = (value) => value.toFixed(1) + "/s";
    draw("chart-in", lines((b) => rates(b, "messages_in")), perSecond);
    draw("chart-out", lines((b) => rates(b, "messages_out")), perSecond);
    draw("chart-bytes-in", lines((b) => rates(b, "bytes_in")), (v) => bytes(v) + "/s");
    const lag = lines((b) => b.samples.filter((s) => s.replica_lag_bytes !== null)
      .map((s) => [s.at_ms, s.replica_lag_bytes])).filter((line) => line.points.length > 0);
    draw("chart-lag", lag, bytes);
    if (lag.length === 0) {
      document.getElementById("chart-lag-legend").textContent =
        "no master reports a replicating slave";
    }
    const micros = (value) => value >= 1000 ? (value / 1000).toFixed(1) + " ms"
      : value.toFixed(0) + " µs";
    for (const p of ["p50", "p90", "p99"]) {
      const field = p + "_us";
      const latency = lines((b) => b.samples.filter((s) => s.send_latency)
        .map((s) => [s.at_ms, s.send_latency[field]]));
      draw("chart-send-" + p, latency, micros);
      const legend = document.getElementById("chart-send-" + p + "-legend");
      data.brokers.forEach((broker, index) => {
        const window = broker.send_latency_window;
        legend.children[index].append(window ? "; " + micros(window[field]) + " over " +
          window.sends + " send(s) in the window" : "; no send in the window");
      });
    }
    const down = data.brokers.filter((b) => !b.is_up).map((b) => b.address + ": " + b.error);
    const problems = (data.error ? ["cannot list the brokers: " + data.error] : []).concat(down);
    status.textContent = data.brokers.length + " broker(s) sampled" +
      (problems.length ? "; " + problems.join("; ") : "") + ". Refreshed every " +
      METRICS_REFRESH_MS / 1000 + " s.";
    status.className = problems.length ? "error-text" : "muted";
  };
  await render();
  every(METRICS_REFRESH_MS, () => guarded("metrics", render));
}

export const pages = { cluster, topics, groups, messages, dlq, metrics };
