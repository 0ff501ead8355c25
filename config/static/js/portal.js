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
