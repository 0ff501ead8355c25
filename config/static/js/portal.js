// Small enhancements of the portal pages; everything they do also works without JavaScript. The pages carry no
// inline scripts or on* handlers (the Content-Security-Policy allows scripts from this origin only): behaviour is
// declared with data- attributes and wired here.

// Copy-to-clipboard buttons: <button data-copy="text">. The text stays visible (and selectable) beside them.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const label = button.textContent;
  try {
    await navigator.clipboard.writeText(button.dataset.copy);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Select and copy";
  }
  setTimeout(() => { button.textContent = label; }, 1500);
});

// Confirm steps: links with hx-get into <dialog id="confirm-dialog"> open it as a modal once the question arrived;
// "Back" closes it. Without JavaScript the same links lead to the confirm page.
document.addEventListener("htmx:afterSwap", (event) => {
  const dialog = event.detail.target;
  if (dialog.id === "confirm-dialog" && !dialog.open) dialog.showModal();
});
document.addEventListener("click", (event) => {
  const back = event.target.closest("dialog [data-close-dialog]");
  if (!back) return;
  event.preventDefault();
  back.closest("dialog").close();
});

// Select-all: <input type=checkbox data-select-all="name"> ticks every checkbox of that name on the page.
document.addEventListener("change", (event) => {
  const all = event.target.closest("[data-select-all]");
  if (!all) return;
  document.querySelectorAll(`input[type=checkbox][name="${all.dataset.selectAll}"]`).forEach((box) => {
    box.checked = all.checked;
  });
});

// Confirm before submitting: <form data-confirm="question">.
document.addEventListener("submit", (event) => {
  const question = event.target.closest("form[data-confirm]")?.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

// Submit a form as soon as a choice changes: <select data-submit-on-change>.
document.addEventListener("change", (event) => {
  const select = event.target.closest("[data-submit-on-change]");
  if (select) select.form.requestSubmit();
});

// Move focus to what the page wants read first (an error summary): <div data-autofocus tabindex="-1">.
document.querySelector("[data-autofocus]")?.focus();

// A live part of the page (the order preview, a request page following itself) asked the server while the session
// had ended: the server answers 401 session_ended with the sign-in page that comes back here (config/session_end.py).
// Nothing is swapped in and the focus stays where it is; the page says so in its status line and keeps its forms,
// which come back after the sign-in. Any later update that goes through (signed in again in another tab) clears it.
const pageProblem = () => document.getElementById("page-problem");

function showSessionEnded(signInUrl) {
  keepDrafts(); // on every answer: what was typed since the last one counts too
  const line = pageProblem();
  if (!line || line.dataset.code === "session_ended") return;
  line.dataset.code = "session_ended";
  line.textContent = "Your session ended — ";
  const link = document.createElement("a");
  link.href = signInUrl;
  link.id = "sign-in-again";
  link.textContent = "sign in again";
  link.addEventListener("click", keepDrafts); // and what was typed after the last answer, on the way out
  line.append(link, document.querySelector("form[data-keep-draft]") ? ". What you typed here is kept." : ".");
}

function showUpdateFailed(status) {
  const line = pageProblem();
  if (!line || line.dataset.code === "session_ended") return;
  line.dataset.code = "update_failed";
  line.textContent = status === 403
    ? "This page is out of date: reload it (and sign in again if asked)."
    : "This part of the page could not be updated; it tries again, or reload the page.";
}

document.addEventListener("htmx:responseError", (event) => {
  const xhr = event.detail.xhr;
  if (xhr.status === 401) {
    let body = {};
    try { body = JSON.parse(xhr.responseText); } catch { /* not ours: the sign-in page itself */ }
    showSessionEnded(body.details?.sign_in_url || "/accounts/login/");
  } else {
    showUpdateFailed(xhr.status);
  }
});
document.addEventListener("htmx:afterRequest", (event) => {
  const line = pageProblem();
  if (event.detail.successful && line && line.dataset.code) {
    delete line.dataset.code;
    line.textContent = "";
  }
});

// Forms marked data-keep-draft keep what they hold in this tab's sessionStorage when they are sent and when the
// session ends; the page a sign-in returns to (?resume=1) puts it back and drops the copy. Hidden fields (the CSRF
// token, the form's idempotency key) are the new page's own and never put back.
const draftKey = (form) => `draft:${form.getAttribute("action") || location.pathname}`;

function keepDraft(form) {
  const fields = [];
  for (const element of form.elements) {
    if (!element.name || element.type === "hidden" || element.type === "submit" || element.type === "button") continue;
    if ((element.type === "checkbox" || element.type === "radio") && !element.checked) continue;
    if (element.type === "select-multiple") {
      for (const option of element.selectedOptions) fields.push([element.name, option.value]);
    } else {
      fields.push([element.name, element.value]);
    }
  }
  try { sessionStorage.setItem(draftKey(form), JSON.stringify(fields)); } catch { /* storage full or off */ }
}

function keepDrafts() {
  document.querySelectorAll("form[data-keep-draft]").forEach(keepDraft);
}

function restoreDraft(form) {
  let fields;
  try { fields = JSON.parse(sessionStorage.getItem(draftKey(form)) || "null"); } catch { fields = null; }
  if (!fields) return false;
  sessionStorage.removeItem(draftKey(form));
  const values = new Map();
  for (const [name, value] of fields) values.set(name, [...(values.get(name) || []), value]);
  for (const element of form.elements) {
    if (!element.name || element.type === "hidden" || element.type === "submit" || element.type === "button") continue;
    const kept = values.get(element.name) || [];
    if (element.type === "checkbox") element.checked = kept.includes(element.value);
    else if (element.type === "radio") { if (kept.length) element.checked = kept.includes(element.value); }
    else if (element.type === "select-multiple") for (const option of element.options) option.selected = kept.includes(option.value);
    else if (values.has(element.name)) element.value = kept[0];
  }
  return true;
}

document.addEventListener("submit", (event) => {
  if (event.target.matches("form[data-keep-draft]")) keepDraft(event.target);
});

document.addEventListener("DOMContentLoaded", () => {
  const url = new URL(location.href);
  if (url.searchParams.get("resume") !== "1") return;
  url.searchParams.delete("resume");
  history.replaceState(history.state, "", url);
  for (const form of document.querySelectorAll("form[data-keep-draft]")) {
    if (!restoreDraft(form)) continue;
    const note = document.createElement("p");
    note.className = "restored-note";
    note.id = "draft-restored";
    note.setAttribute("role", "status");
    note.textContent = "What you had typed before signing in again is back in the form.";
    form.prepend(note);
    form.dispatchEvent(new Event("change", { bubbles: true })); // the preview follows the restored form
  }
});

// Panels a phone does without at first (the catalog's search and filters): <details open data-fold-on-phone> is
// folded on a narrow screen, so that what the page is for comes first; its summary opens it again.
document.addEventListener("DOMContentLoaded", () => {
  if (!window.matchMedia("(max-width: 40rem)").matches) return;
  document.querySelectorAll("details[data-fold-on-phone]").forEach((panel) => { panel.open = false; });
});
