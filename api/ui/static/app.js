// The dashboard's shell: sign-in, the navigation, and the router (#/jobs, #/jobs/<id>,
// #/compare/<id>,<id>, #/models, #/models/<id>, #/workers, #/workers/<id>, #/best). Each page is a module with
// `render(view, ctx)`; it returns a function that stops its timers and streams when the person
// leaves the page.

import { api, ApiError, session } from "./api.js";
import { fill, clear, errorBox, h } from "./dom.js";
import * as best from "./pages/best.js";
import * as compare from "./pages/compare.js";
import * as job from "./pages/job.js";
import * as jobs from "./pages/jobs.js";
import * as model from "./pages/model.js";
import * as models from "./pages/models.js";
import * as workers from "./pages/workers.js";

const ROUTES = [
  [/^#\/jobs\/([A-Za-z0-9]+)$/, job, "user"],
  [/^#\/jobs$/, jobs, "user"],
  [/^#\/compare\/([A-Za-z0-9,]+)$/, compare, "user"],
  [/^#\/models\/([A-Za-z0-9]+)$/, model, "user"],
  [/^#\/models$/, models, "user"],
  [/^#\/workers\/([A-Za-z0-9_-]+)$/, workers, "user"],
  [/^#\/workers$/, workers, "user"],
  [/^#\/best$/, best, "reader"],
];

const view = document.getElementById("view");
let me = null;  // GET /v1/whoami of the signed-in token
let leave = null;

function allowed(need) {
  if (!me) return false;
  if (me.scope === "admin") return true;
  return need === "reader" ? ["user", "worker"].includes(me.scope) : me.scope === need;
}

function showWho() {
  const who = clear(document.getElementById("who"));
  const nav = document.getElementById("nav");
  nav.hidden = !me;
  if (!me) return;
  for (const a of nav.querySelectorAll("a")) a.hidden = !allowed(a.dataset.scope);
  who.append(h("span", { class: "muted", id: "signed-in" }, `${me.name || me.owner} (${me.scope})`),
    h("button", { type: "button", class: "link", onclick: signOut }, "Sign out"));
}

function signOut() {
  session.signOut();
  me = null;
  showWho();
  route();
}

function signInPage(message) {
  const input = h("input", {
    type: "password", id: "token", name: "token", autocomplete: "off", required: true,
    placeholder: "tf_...", "aria-label": "API token",
  });
  const status = h("p", { class: "muted", role: "status" }, message || "");
  const form = h("form", { class: "signin" },
    h("h1", null, "Sign in"),
    h("p", null, "Paste a tunefarm API token (`tunefarm token create --scope user`). ",
      "It is kept in this browser's open tabs of this dashboard only (a new tab asks them; nothing is saved to disk) and sent to this API only."),
    input, h("button", { type: "submit" }, "Sign in"), status);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    status.textContent = "Checking…";
    try {
      me = await api("/v1/whoami", { token: input.value.trim() });
      session.signIn(input.value.trim());
      showWho();
      if (!location.hash || location.hash === "#/") {
        location.hash = allowed("user") ? "#/jobs" : "#/best";
      } else route();
    } catch (err) {
      status.textContent = err instanceof ApiError && err.status === 401
        ? "This token was refused: it is unknown, revoked or expired." : String(err.message);
    }
  });
  fill(view, form);
  input.focus();
}

let borrowed = false;  // asked the other tabs for their sign-in once, at load

async function route() {
  if (leave) { leave(); leave = null; }
  if (!session.token() && !borrowed) {
    borrowed = true;
    const token = await session.borrow();
    if (token) session.signIn(token);
  }
  if (!session.token()) { signInPage(); return; }
  if (!me) {
    try {
      me = await api("/v1/whoami");
      showWho();
    } catch (err) {
      signInPage(err instanceof ApiError && err.status === 401 ? "Your token is no longer accepted." : String(err.message));
      return;
    }
  }
  const hash = location.hash || (allowed("user") ? "#/jobs" : "#/best");
  for (const [re, page, need] of ROUTES) {
    const m = hash.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
    }
    clear(view);
    for (const k of Object.keys(view.dataset)) delete view.dataset[k];
    if (!allowed(need)) {
      view.append(errorBox(new Error(`This page needs a ${need} token; yours has scope ${me.scope}.`)));
      return;
    }
    leave = page.render(view, { id: m[1] || null, me });
    return;
  }
  fill(view, errorBox(new Error(`No page ${hash}`)));
}

window.addEventListener("hashchange", route);
session.share(() => {  // another tab signed out
  me = null;
  showWho();
  route();
});
window.addEventListener("tunefarm:unauthorized", () => {
  session.signOut(false);
  me = null;
  showWho();
  signInPage("Your token is no longer accepted: sign in again.");
});
route();
