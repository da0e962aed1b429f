// The Agentry console. Everything a session, a model, a tool or a file
// says is put on the page as text (textContent, text nodes): no HTML from
// the server is ever parsed, so a model's `<script>` stays letters.

const state = {
  me: null,          // {name, role, csrf}
  source: null,      // the open EventSource
  timers: [],        // polls of the current page
  openBlocks: new Map(), // call_id -> the person's fold choice
};

const ROLES = ["viewer", "operator", "approver", "admin", "service"];
const can = (role) => state.me && ROLES.indexOf(state.me.role) >= ROLES.indexOf(role);

// ---------------------------------------------------------------------------
// DOM helpers: text only.
// ---------------------------------------------------------------------------

function el(tag, props, ...kids) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "href") node.setAttribute("href", value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  return add(node, ...kids);
}

// Appends `kids` to `node`: strings as text, nothing for null or false.
function add(node, ...kids) {
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(typeof kid === "string" || typeof kid === "number" ? String(kid) : kid);
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function toast(message) {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ms).toLocaleDateString();
}

// ---------------------------------------------------------------------------
// The API.
// ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.reason = body && body.reason;
  }
}

async function api(method, path, body) {
  const headers = {};
  if (method !== "GET") {
    headers["content-type"] = "application/json";
    if (state.me) headers["x-agentry-csrf"] = state.me.csrf;
  }
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: method === "GET" ? undefined : JSON.stringify(body || {}),
  });
  let data = null;
  try { data = await response.json(); } catch (_) { data = null; }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401 && path !== "/api/login") showLogin(error.message);
    throw error;
  }
  return data;
}

async function act(what, fn) {
  try {
    return await fn();
  } catch (e) {
    if (e.status !== 401) toast(`${what}: ${e.message}`);
    return null;
  }
}

// ---------------------------------------------------------------------------
// Markdown, as DOM nodes: a safe subset (headings, lists, quotes, code with
// highlighting, emphasis, links to http(s) only). HTML in it is text.
// ---------------------------------------------------------------------------

const KEYWORDS = new Set(("fn let mut pub use mod struct enum impl trait match if else for while loop " +
  "return break continue async await const static type where def class import from as with try except " +
  "finally raise lambda pass yield function var new this null true false None True False self " +
  "export default package interface extends implements public private protected void int string " +
  "bool echo then fi do done case esac in local").split(" "));

function highlight(code, lang) {
  const out = [];
  const hash = /^(sh|bash|shell|zsh|py|python|toml|yaml|yml|rb|ruby|conf)$/.test(lang || "");
  const re = hash
    ? /(#[^\n]*)|("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')|(\b\d[\w.]*\b)|([A-Za-z_][\w]*)/g
    : /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`)|(\b\d[\w.]*\b)|([A-Za-z_][\w]*)/g;
  let last = 0;
  for (const m of code.matchAll(re)) {
    if (m.index > last) out.push(code.slice(last, m.index));
    if (m[1]) out.push(el("span", { class: "tok-c", text: m[1] }));
    else if (m[2]) out.push(el("span", { class: "tok-s", text: m[2] }));
    else if (m[3]) out.push(el("span", { class: "tok-n", text: m[3] }));
    else if (KEYWORDS.has(m[4])) out.push(el("span", { class: "tok-k", text: m[4] }));
    else out.push(m[4]);
    last = m.index + m[0].length;
  }
  if (last < code.length) out.push(code.slice(last));
  return out;
}

function safeUrl(text) {
  try {
    const url = new URL(text, window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch (_) {
    return null;
  }
}

const INLINE = /(`+)([^`][\s\S]*?)\1|\*\*([^*][\s\S]*?)\*\*|__([^_][\s\S]*?)__|\*([^*\s][^*]*?)\*|\b_([^_\s][^_]*?)_\b|(!?)\[([^\]\n]*)\]\(([^)\s]+)\)/g;

function inline(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[2] !== undefined) out.push(el("code", { text: m[2] }));
    else if (m[3] !== undefined) out.push(el("strong", {}, inline(m[3])));
    else if (m[4] !== undefined) out.push(el("strong", {}, inline(m[4])));
    else if (m[5] !== undefined) out.push(el("em", {}, inline(m[5])));
    else if (m[6] !== undefined) out.push(el("em", {}, inline(m[6])));
    else if (m[9] !== undefined) {
      // An image is never loaded (nothing leaves the page): a link to it.
      const label = m[7] ? `image: ${m[8] || m[9]}` : m[8];
      const href = safeUrl(m[9]);
      out.push(href
        ? el("a", { href, rel: "noopener noreferrer nofollow", target: "_blank" }, label)
        : `${label} (${m[9]})`);
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

const BLOCK_START = /^\s*(```|~~~|#{1,6}\s|>|[-*+]\s|\d+[.)]\s)/;

function markdown(source, depth = 0) {
  const root = document.createDocumentFragment();
  if (depth > 8) {
    // Quotes nested deeper than anyone writes: the rest as text.
    root.append(el("p", { class: "plain", text: source }));
    return root;
  }
  const lines = source.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      const code = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i++]);
      i++;
      root.append(el("pre", {}, el("code", {}, highlight(code.join("\n"), fence[2].toLowerCase()))));
      continue;
    }
    if (!line.trim()) { i++; continue; }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      root.append(el(`h${Math.min(heading[1].length + 2, 6)}`, {}, inline(heading[2])));
      i++;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { root.append(el("hr")); i++; continue; }
    if (/^\s*>/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
      root.append(el("blockquote", {}, markdown(quoted.join("\n"), depth + 1)));
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      const ordered = /\d/.test(item[1]);
      const list = el(ordered ? "ol" : "ul");
      while (i < lines.length) {
        const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (!m || /\d/.test(m[1]) !== ordered) break;
        let text = m[2];
        i++;
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !BLOCK_START.test(lines[i])) {
          text += " " + lines[i++].trim();
        }
        list.append(el("li", {}, inline(text)));
      }
      root.append(list);
      continue;
    }
    const paragraph = [line];
    i++;
    while (i < lines.length && lines[i].trim() && !BLOCK_START.test(lines[i])) paragraph.push(lines[i++]);
    const p = el("p");
    paragraph.forEach((text, n) => {
      if (n) p.append(el("br"));
      p.append(...inline(text));
    });
    root.append(p);
  }
  return root;
}

// ---------------------------------------------------------------------------
// Login.
// ---------------------------------------------------------------------------

function stopPage() {
  state.page = (state.page || 0) + 1;
  if (state.source) { state.source.close(); state.source = null; }
  state.timers.forEach(clearInterval);
  state.timers = [];
}

function showLogin(message) {
  stopPage();
  state.me = null;
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;
  const token = el("input", { type: "password", id: "token", autocomplete: "current-password",
    placeholder: "agentry_user_…", "aria-label": "Your token" });
  const error = el("p", { class: "note error", id: "login-error", text: message || "" });
  const form = el("form", { class: "card login", id: "login" },
    el("h2", { text: "Log in" }),
    el("p", { class: "muted", text: "With your token: `agentry users add NAME --role ROLE` printed it; " +
      "`agentry token` prints the admin's." }),
    token,
    el("p", {}, el("button", { class: "primary", type: "submit", text: "Log in" })),
    error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      state.me = await api("POST", "/api/login", { token: token.value });
      token.value = "";
      started();
    } catch (e) {
      error.textContent = e.message;
    }
  });
  clear(document.getElementById("main")).append(form);
  token.focus();
}

function started() {
  document.getElementById("who").textContent = `${state.me.name} (${state.me.role})`;
  document.getElementById("logout").hidden = state.me.name === "local";
  route();
}

// ---------------------------------------------------------------------------
// Pages.
// ---------------------------------------------------------------------------

function route() {
  stopPage();
  if (!state.me) return;
  const hash = window.location.hash || "#/";
  const session = hash.match(/^#\/s\/([\w.-]+)$/);
  if (session) return sessionPage(session[1]);
  if (hash === "#/inbox") return inboxPage();
  if (hash === "#/more") return morePage();
  return sessionsPage();
}

function poll(fn, ms) {
  fn();
  state.timers.push(setInterval(fn, ms));
}

async function refreshInboxCount() {
  const data = await act("the inbox", () => api("GET", "/api/approvals"));
  if (!data) return;
  const badge = document.getElementById("inbox-count");
  badge.textContent = String(data.approvals.length);
  badge.hidden = data.approvals.length === 0;
}

function sessionsPage() {
  const main = clear(document.getElementById("main"));
  const search = el("input", { type: "search", id: "search", placeholder: "Search sessions",
    "aria-label": "Search sessions" });
  const list = el("div", { class: "sessions", id: "sessions" });
  const make = can("operator") && el("button", { class: "primary", id: "new-session", text: "New session",
    onclick: async () => {
      const made = await act("a new session", () => api("POST", "/api/sessions", {}));
      if (made) window.location.hash = `#/s/${made.id}`;
    } });
  main.append(el("div", { class: "row" }, el("div", { class: "grow" }, search), make), list);
  const load = async () => {
    const data = await act("the sessions", () =>
      api("GET", `/api/sessions?q=${encodeURIComponent(search.value)}`));
    if (!data) return;
    clear(list);
    if (!data.sessions.length) list.append(el("p", { class: "muted", text: "No session yet." }));
    for (const s of data.sessions) {
      list.append(el("a", { class: "card", href: `#/s/${s.id}`, "data-session": s.id },
        el("div", { class: "row" },
          el("span", { class: "title grow", text: s.name || s.title || s.preview || s.id }),
          s.waiting ? el("span", { class: "badge", title: "waiting for a person", text: `${s.waiting} waiting` }) : null,
          s.turn_open ? el("span", { class: "badge run", text: "running" }) : null),
        el("div", { class: "meta", text: [s.id.slice(0, 8), ago(s.updated_ms), `${s.messages} messages`,
          s.currency ? `${s.cost.toFixed(4)} ${s.currency}` : null, s.project_dir].filter(Boolean).join(" · ") })));
    }
  };
  search.addEventListener("input", () => { clearTimeout(search.timer); search.timer = setTimeout(load, 250); });
  poll(load, 4000);
  poll(refreshInboxCount, 4000);
}

function inboxPage() {
  const main = clear(document.getElementById("main"));
  const list = el("div", { id: "inbox" });
  main.append(el("h2", { text: "Waiting for a person" }), list);
  const empty = el("p", { class: "muted", text: "Nothing waits." });
  const load = async () => {
    const data = await act("the inbox", () => api("GET", "/api/approvals"));
    if (!data) return;
    const cards = questionsInto(list, data.approvals.map((a) => ({
      session_id: a.session_id, where: a.session_title || a.session_id.slice(0, 8),
      call_id: a.call_id, tool: a.tool, arguments: a.arguments, rule: a.rule, network: a.network,
      outcome_unknown: a.rule.startsWith("outcome unknown"), approvers: a.approvers || null,
      approved_by: a.approved_by,
    })), load);
    if (!cards) list.append(empty); else empty.remove();
  };
  poll(load, 3000);
  poll(refreshInboxCount, 3000);
}

async function morePage() {
  const page = state.page;
  const main = clear(document.getElementById("main"));
  const data = await act("the overview", () => api("GET", "/api/overview"));
  if (!data || page !== state.page) return;
  const section = (title, ...kids) => el("section", { class: "card" }, el("h3", { text: title }), ...kids);
  if (data.model_problem) main.append(el("p", { class: "note error", text: `Model: ${data.model_problem}` }));
  const sandbox = Array.isArray(data.sandbox) ? data.sandbox : [data.sandbox.error];
  main.append(section("Sandbox", el("ul", {}, sandbox.map((l) => el("li", { text: l })))));
  main.append(section("MCP servers", data.mcp_servers.length
    ? el("ul", {}, data.mcp_servers.map((s) => el("li", {
      text: `${s.name} (${s.transport}): ${s.state}, ${s.tools} tools${s.error ? ` — ${s.error}` : ""}` })))
    : el("p", { class: "muted", text: "None configured." })));
  const reminders = Array.isArray(data.reminders) ? data.reminders : [];
  main.append(section("Reminders", reminders.length
    ? el("ul", {}, reminders.map((r) => el("li", {},
      el("a", { href: `#/s/${r.session_id}`, text: r.session_id.slice(0, 8) }),
      ` ${r.status}, next ${r.next_due_ms ? new Date(r.next_due_ms).toLocaleString() : "—"}: ${r.message}`)))
    : el("p", { class: "muted", text: data.reminders.error || "None." })));
  main.append(section(`Tools (${data.tools.length}; context window ${data.context_window} tokens)`,
    el("ul", {}, data.tools.map((t) => el("li", {},
      el("code", { text: t.name }),
      ` ${t.read_only ? "reads" : "changes"}${t.network ? ", network" : ""}${t.mcp_server ? `, from ${t.mcp_server}` : ""}`)))));
}

// ---------------------------------------------------------------------------
// A session.
// ---------------------------------------------------------------------------

function argumentsView(sessionId, q) {
  let args = null;
  try { args = JSON.parse(q.arguments); } catch (_) { args = null; }
  if (q.tool === "bash" && args && typeof args.command === "string") {
    return el("pre", { class: "command", text: `$ ${args.command}` });
  }
  if (args && typeof args.path === "string" && /^(write_file|edit_file|apply_patch)$/.test(q.tool)) {
    const box = el("div", { class: "diff" }, el("div", { class: "meta", text: args.path }));
    const pre = el("pre", { text: "…" });
    box.append(pre);
    api("GET", `/api/sessions/${sessionId}/preview/${encodeURIComponent(q.call_id)}`).then((p) => {
      clear(pre);
      if (p.error) { pre.textContent = p.error; return; }
      for (const line of (p.diff || "(no change)").split("\n")) {
        const cls = line.startsWith("+") && !line.startsWith("+++") ? "add"
          : line.startsWith("-") && !line.startsWith("---") ? "del" : null;
        pre.append(el("span", { class: cls, text: `${line}\n` }));
      }
    }).catch(() => { pre.textContent = JSON.stringify(args, null, 2); });
    return box;
  }
  return el("pre", { text: args ? JSON.stringify(args, null, 2) : q.arguments });
}

// Shows `questions` in `box`, keeping the cards already there (a reason
// being typed, an edit open) and adding or removing the others; how many.
function questionsInto(box, questions, after) {
  const key = (q) => `${q.session_id}/${q.call_id}/${q.arguments}/${(q.approved_by || []).join(",")}`;
  const wanted = new Map(questions.map((q) => [key(q), q]));
  for (const card of [...box.querySelectorAll(":scope > .question")]) {
    if (!wanted.has(card.dataset.key)) card.remove();
  }
  for (const [k, q] of wanted) {
    if ([...box.children].some((c) => c.dataset.key === k)) continue;
    const where = q.where ? el("a", { href: `#/s/${q.session_id}`, text: q.where }) : null;
    const card = questionCard(q.session_id, q, where, after);
    card.dataset.key = k;
    box.append(card);
  }
  return wanted.size;
}

function questionCard(sessionId, q, where, after) {
  const reason = el("input", { type: "text", placeholder: "Why (the agent is told)", "aria-label": "Reason" });
  const card = el("div", { class: "card question", "data-call": q.call_id });
  const send = async (decision, extra) => {
    const done = await act("the answer", () => api("POST",
      `/api/sessions/${sessionId}/approvals/${encodeURIComponent(q.call_id)}`,
      { decision, reason: reason.value, ...(extra || {}) }));
    if (done) { card.remove(); if (after) after(); }
  };
  const buttons = el("div", { class: "row" });
  if (!can("approver")) {
    buttons.append(el("span", { class: "muted", text: "An approver answers this." }));
  } else if (q.outcome_unknown) {
    buttons.append(
      el("button", { text: "Check", onclick: () => send("check") }),
      el("button", { text: "Run again", onclick: () => send("approve") }),
      el("button", { class: "danger", text: "Skip", onclick: () => send("deny") }));
  } else {
    const edit = el("button", { text: "Edit", onclick: () => {
      const area = el("textarea", { "aria-label": "Arguments" });
      try { area.value = JSON.stringify(JSON.parse(q.arguments), null, 2); } catch (_) { area.value = q.arguments; }
      card.append(area, el("button", { class: "primary", text: "Run as edited",
        onclick: () => send("edit", { arguments: area.value }) }));
      edit.disabled = true;
    } });
    add(buttons,
      el("button", { class: "primary", text: "Approve", onclick: () => send("approve") }),
      el("button", { class: "danger", text: "Deny", onclick: () => send("deny") }),
      q.approvers ? null : el("button", { text: "Always in this session", onclick: () => send("approve_for_session") }),
      edit);
  }
  add(card,
    el("div", { class: "row" }, el("strong", { class: "grow", text: `${q.tool}` }), where || null),
    argumentsView(sessionId, q),
    el("div", { class: "meta", text: `asked by ${q.rule}` }),
    q.network ? el("div", { class: "meta", text: "with outbound network" }) : null,
    q.approvers ? el("div", { class: "meta", text: `approved by: ${q.approvers}` +
      (q.approved_by && q.approved_by.length ? ` (so far: ${q.approved_by.join(", ")})` : "") }) : null,
    can("approver") && !q.outcome_unknown ? reason : null,
    buttons);
  return card;
}

function entryNode(sessionId, entry) {
  const box = el("div", { class: `entry ${entry.kind}${entry.rewound ? " rewound" : ""}`, "data-i": entry.i });
  switch (entry.kind) {
    case "user":
      if (entry.by) box.append(el("div", { class: "by", text: entry.by }));
      box.append(el("div", { class: "user", text: entry.text }));
      break;
    case "answer": {
      // While it streams, plain text (cheap to redo on every piece); once
      // logged, markdown.
      const answer = entry.streaming
        ? el("div", { class: "answer streaming", text: entry.text })
        : el("div", { class: "answer" }, markdown(entry.text));
      box.append(answer);
      if (!entry.streaming && entry.seq && can("operator")) {
        box.append(el("button", { class: "link", text: "Fork from here", title: "A new session with everything up to here",
          onclick: async () => {
            const forked = await act("the fork", () => api("POST", `/api/sessions/${sessionId}/fork`, { at_seq: entry.seq }));
            if (forked && forked.session) window.location.hash = `#/s/${forked.session.id}`;
          } }));
      }
      break;
    }
    case "tool": {
      const known = state.openBlocks.get(entry.call_id);
      const open = known !== undefined ? known : entry.state !== "done";
      const details = el("details", { class: `tool${entry.is_error ? " error" : ""}`, open },
        el("summary", {}, `${{ requested: "…", waiting: "?", running: "▶", done: entry.is_error ? "✗" : "✓" }[entry.state]} `,
          el("strong", { text: entry.tool }), ` ${entry.summary}`,
          entry.decision ? el("span", { class: "meta", text: ` — ${entry.decision}` }) : null,
          entry.state === "done" && entry.duration_ms ? el("span", { class: "meta", text: ` (${entry.duration_ms} ms)` }) : null),
        entry.output ? el("pre", { class: "output", text: entry.output }) : null);
      details.addEventListener("toggle", () => state.openBlocks.set(entry.call_id, details.open));
      box.append(details);
      break;
    }
    case "note":
      box.append(el("div", { class: `note ${entry.note}`, text: entry.text }));
      break;
    case "turn": {
      const row = el("div", { class: "turn" }, el("span", { text: `Turn ${entry.turn}` }));
      if (can("operator") && !entry.rewound) {
        const rewind = el("button", { text: "Rewind to before this", onclick: async () => {
          if (rewind.dataset.sure !== "yes") {
            rewind.dataset.sure = "yes";
            rewind.textContent = "Sure? Rewind";
            return;
          }
          await act("the rewind", () => api("POST", `/api/sessions/${sessionId}/rewind`, { turn: entry.turn - 1 }));
        } });
        row.append(rewind);
      }
      box.append(row);
      break;
    }
    default:
      box.append(el("div", { class: "note", text: JSON.stringify(entry) }));
  }
  return box;
}

async function sessionPage(id) {
  const page = state.page;
  const main = clear(document.getElementById("main"));
  const session = await act("the session", () => api("GET", `/api/sessions/${id}`));
  // Another page was opened meanwhile: this one is gone.
  if (!session || page !== state.page) return;
  const status = el("div", { class: "status", id: "status" });
  const transcript = el("div", { id: "transcript" });
  const questions = el("div", { id: "questions" });
  main.append(
    el("h2", { class: "title", text: session.name || session.title || session.id }),
    el("div", { class: "meta", text: [session.id, session.project_dir].filter(Boolean).join(" · ") }),
    status, transcript, questions);
  const entries = [];
  const known = [];
  const render = (kind, data) => {
    // Measured before the page grows: follow the end only if it was in view.
    const near = window.innerHeight + window.scrollY >= document.body.scrollHeight - 200;
    if (kind === "snapshot") { entries.length = 0; known.length = 0; clear(transcript); }
    for (let entry of data.entries) {
      if (entry.append !== undefined) {
        // More of an answer still streaming.
        const before = known[entry.i];
        if (!before) continue;
        entry = { ...before, text: before.text + entry.append, streaming: entry.streaming };
      }
      known[entry.i] = entry;
      const node = entryNode(id, entry);
      if (entry.i < entries.length) {
        transcript.replaceChild(node, entries[entry.i]);
        entries[entry.i] = node;
      } else {
        entries.push(node);
        transcript.append(node);
      }
    }
    const s = data.status;
    const activity = s.activity === "model" ? "thinking" : s.activity === "waiting" ? "waiting for a person"
      : s.activity ? `running ${s.activity.slice(5)}` : "";
    status.textContent = [s.model, s.turn_open ? (activity || "working") : "idle",
      `${s.tokens} tokens`, s.currency ? `${s.cost.toFixed(4)} ${s.currency}` : null].filter(Boolean).join(" · ");
    if (data.ended) status.textContent += ` · ${data.ended}`;
    questionsInto(questions, data.questions.map((q) => ({ ...q, session_id: id })), null);
    composer.setRunning(s.turn_open);
    if (near) window.scrollTo(0, document.body.scrollHeight);
  };
  const composer = makeComposer(id);
  if (can("operator")) main.append(composer.node);
  const source = new EventSource(`/api/sessions/${id}/live`);
  state.source = source;
  const handle = (event) => {
    try { render(event.type, JSON.parse(event.data)); } catch (e) { toast(`the live view: ${e.message}`); }
  };
  source.addEventListener("snapshot", handle);
  source.addEventListener("patch", handle);
  source.addEventListener("error", async () => {
    status.textContent = "reconnecting…";
    if (source.readyState === EventSource.CLOSED && page === state.page) {
      // Refused for good (the login ended): api() shows the login form.
      const me = await act("the login", () => api("GET", "/api/me"));
      if (me && page === state.page) route();
    }
  });
}

function makeComposer(id) {
  const text = el("textarea", { id: "message", placeholder: "Message the agent", "aria-label": "Message" });
  const plan = el("input", { type: "checkbox", id: "plan" });
  const network = el("input", { type: "checkbox", id: "network" });
  const budget = el("input", { type: "number", id: "budget", min: "0", step: "any", placeholder: "raise budget",
    "aria-label": "Raise the session's spending limit to" });
  const sendButton = el("button", { class: "primary", id: "send", type: "submit", text: "Send" });
  const cancel = el("button", { class: "danger", id: "cancel", type: "button", text: "Cancel turn", hidden: true,
    onclick: () => act("the cancel", () => api("POST", `/api/sessions/${id}/cancel`, {})) });
  const form = el("form", { class: "composer" }, text,
    el("div", { class: "row" },
      el("label", {}, plan, "Plan first"),
      el("label", {}, network, "Network"),
      el("span", { class: "grow" }, budget),
      cancel, sendButton));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!text.value.trim()) return;
    const body = { text: text.value, plan: plan.checked, network: network.checked };
    if (budget.value) body.budget_cost = Number(budget.value);
    const sent = await act("the message", () => api("POST", `/api/sessions/${id}/messages`, body));
    if (sent) { text.value = ""; budget.value = ""; }
  });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  return {
    node: form,
    setRunning(running) { cancel.hidden = !running; },
  };
}

// ---------------------------------------------------------------------------
// Start.
// ---------------------------------------------------------------------------

document.getElementById("logout").addEventListener("click", async () => {
  await act("the logout", () => api("POST", "/api/logout", {}));
  showLogin("Logged out.");
});
window.addEventListener("hashchange", route);

(async () => {
  try {
    state.me = await api("GET", "/api/me");
    started();
  } catch (e) {
    if (e.status !== 401) showLogin(e.message);
  }
})();
