// The REST API as the dashboard calls it: the bearer token of the signed-in person (kept in
// this tab's sessionStorage, gone when the tab closes), problem+json errors as ApiError, and
// server-sent events read over fetch (EventSource cannot send an Authorization header).

const KEY = "tunefarm.token";
// Tabs of this origin share the sign-in without storing the token anywhere that outlives them:
// a new tab asks the open ones over a BroadcastChannel (same origin only) and a signed-in tab
// answers; signing out in one tab signs out all of them.
const channel = typeof BroadcastChannel === "function" ? new BroadcastChannel("tunefarm.session") : null;

export const session = {
  token: () => sessionStorage.getItem(KEY),
  signIn: (token) => sessionStorage.setItem(KEY, token),
  signOut: (everywhere = true) => {
    sessionStorage.removeItem(KEY);
    if (everywhere && channel) channel.postMessage({ type: "signout" });
  },
  // the token of another open tab, or null after `waitMs`
  borrow: (waitMs = 400) => new Promise((resolve) => {
    if (!channel) { resolve(null); return; }
    const done = (token) => { channel.removeEventListener("message", onMsg); clearTimeout(timer); resolve(token); };
    const onMsg = (e) => { if (e.data && e.data.type === "token" && typeof e.data.token === "string") done(e.data.token); };
    const timer = setTimeout(() => done(null), waitMs);
    channel.addEventListener("message", onMsg);
    channel.postMessage({ type: "ask" });
  }),
  // call `onSignOut` when another tab signs out; answer other tabs' asks while signed in
  share: (onSignOut) => {
    if (!channel) return;
    channel.addEventListener("message", (e) => {
      const t = sessionStorage.getItem(KEY);
      if (e.data && e.data.type === "ask" && t) channel.postMessage({ type: "token", token: t });
      else if (e.data && e.data.type === "signout" && t) { sessionStorage.removeItem(KEY); onSignOut(); }
    });
  },
};

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem && problem.detail ? problem.detail : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

export async function api(path, { method = "GET", body, signal, token } = {}) {
  const headers = { Authorization: `Bearer ${token || session.token() || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (e) {
    data = { detail: text.slice(0, 200) };
  }
  if (!r.ok) {
    if (r.status === 401 && !token) window.dispatchEvent(new CustomEvent("tunefarm:unauthorized"));
    throw new ApiError(r.status, data);
  }
  return data;
}

// A non-JSON resource (a CSV download) as text; errors as `api` gives them.
export async function apiText(path) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${session.token() || ""}` } });
  if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
  return r.text();
}

function parseEvent(block) {
  const ev = { id: null, type: "message", data: [] };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "id") ev.id = value;
    else if (field === "event") ev.type = value;
    else if (field === "data") ev.data.push(value);
  }
  if (!ev.data.length) return null;
  try {
    return { id: ev.id, type: ev.type, data: JSON.parse(ev.data.join("\n")) };
  } catch (e) {
    return null;
  }
}

// Follow a job's events until its terminal state or `signal` aborts; after a dropped
// connection, reconnect after the last event seen (`after=`), so nothing is lost or repeated.
export async function follow(jobId, onEvent, signal) {
  let after = null;
  let failures = 0;
  while (!signal.aborted) {
    const q = after ? `?after=${encodeURIComponent(after)}` : "";
    try {
      const r = await fetch(`/v1/jobs/${encodeURIComponent(jobId)}/events${q}`, {
        headers: { Authorization: `Bearer ${session.token() || ""}`, Accept: "text/event-stream" },
        signal,
      });
      if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => null));
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;  // the server ends the stream after the terminal state
        failures = 0;
        buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const ev = parseEvent(buf.slice(0, cut));
          buf = buf.slice(cut + 2);
          if (ev) {
            if (ev.id) after = ev.id;
            onEvent(ev);
          }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && e.status < 500 && e.status !== 429) throw e;
      failures += 1;
      await new Promise((res) => setTimeout(res, Math.min(10000, 500 * 2 ** failures)));
    }
  }
}
