// SpecEyes review pages: small progressive enhancements. Every page works without this
// file; with it, a running batch's progress updates in place, a job's image zooms on a
// click, and the review queue is driven from the keyboard.
"use strict";

// A batch that is still running: fetch its progress fragment again every 2 s until the
// server sends one without data-refresh (the batch finished).
function followProgress() {
  const section = document.querySelector("#progress[data-refresh]");
  if (!section) return;
  const url = section.getAttribute("data-refresh");
  const timer = setInterval(async () => {
    let response;
    try {
      response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
    } catch (error) {
      return; // offline a moment: try again at the next tick
    }
    if (response.redirected || response.status === 401) { // signed out: stop asking
      clearInterval(timer);
      return;
    }
    if (!response.ok) return;
    const holder = document.createElement("div");
    holder.innerHTML = await response.text(); // the server's escaped HTML, no script runs
    const fresh = holder.querySelector("#progress");
    const current = document.querySelector("#progress");
    if (!fresh || !current) return;
    current.replaceWith(fresh);
    if (!fresh.hasAttribute("data-refresh")) clearInterval(timer);
  }, 2000);
}

// A job's image: a click toggles between fitting the page and its full size.
function zoomImages() {
  for (const box of document.querySelectorAll("[data-zoomable]")) {
    box.addEventListener("click", () => box.classList.toggle("zoomed"));
  }
}

// The review queue: one entry shown at a time (without this script, every entry is a
// plain form, one under the other).
//   j / k: next / previous entry; 1-9: pick that option; e: edit the answer's text;
//   Enter: confirm (the review is sent, the entry marked, the next one shown).
// One review is in flight at a time; a confirmed entry is sent again only if its answer
// was changed since (a correction), and the queue moves on only from the entry sent.
function reviewQueue() {
  const queue = document.querySelector("[data-queue]");
  if (!queue) return;
  queue.classList.add("scripted");
  const entries = Array.from(queue.querySelectorAll(".entry"));
  const finished = document.querySelector("[data-queue-finished]");
  let index = 0;
  let sending = false;

  function show(next) {
    if (next < 0 || next >= entries.length) return;
    entries[index].classList.remove("current");
    index = next;
    entries[index].classList.add("current");
    const after = entries[index + 1];
    if (after) { // preload the next entry's image
      const image = after.querySelector("img.preview");
      if (image) image.loading = "eager";
    }
  }

  function say(entry, text, failed) {
    const status = entry.querySelector(".outcome") || document.createElement("p");
    status.className = failed ? "outcome error" : "outcome";
    status.textContent = text; // text, never HTML
    entry.append(status);
  }

  async function confirm(entry) {
    if (sending) return;
    const form = entry.querySelector("form.review");
    const body = new URLSearchParams(new FormData(form));
    const at = entries.indexOf(entry);
    if (entry.dataset.sent === body.toString()) { // confirmed as it stands: move on
      if (index === at) show(at + 1);
      return;
    }
    sending = true;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body,
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      let reply = null;
      try { reply = await response.json(); } catch (error) { /* not JSON: said below */ }
      if (response.ok && reply) {
        say(entry, "Reviewed: " + reply.final_answer, false);
        entry.classList.add("done");
        entry.dataset.sent = body.toString();
        if (at + 1 < entries.length) {
          if (index === at) show(at + 1); // not if the reviewer has moved on meanwhile
        } else if (finished) finished.hidden = false;
      } else if (reply && reply.error === "signin_required") {
        say(entry, "Not saved: signed out. Reload the page to sign in again.", true);
      } else {
        say(entry, "Not saved: " + ((reply && reply.detail) || response.statusText), true);
      }
    } catch (error) {
      say(entry, "Not saved: the server cannot be reached. Try again.", true);
    } finally {
      sending = false;
    }
  }

  for (const entry of entries) {
    const form = entry.querySelector("form.review");
    const text = form.querySelector(".answer-text");
    form.addEventListener("submit", (event) => { event.preventDefault(); confirm(entry); });
    for (const radio of form.querySelectorAll("input[name=pick]")) {
      radio.addEventListener("change", () => { text.value = radio.value; });
    }
    // typed text is the answer: a pick made before no longer stands
    text.addEventListener("input", () => {
      for (const radio of form.querySelectorAll("input[name=pick]")) radio.checked = false;
    });
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    // keys typed into a field are its own; Enter on a button or a link is theirs
    if (target instanceof HTMLInputElement && target.type === "text") {
      if (event.key === "Escape") target.blur();
      return; // Enter in the field submits its form (the submit handler above)
    }
    const onControl = target instanceof HTMLButtonElement || target instanceof HTMLAnchorElement;
    if (event.key === "Enter" && onControl) return;
    const entry = entries[index];
    if (event.key === "j") show(index + 1);
    else if (event.key === "k") show(index - 1);
    else if (event.key === "e") {
      event.preventDefault();
      const field = entry.querySelector(".answer-text");
      field.focus();
      field.select(); // typing replaces the answer; arrows keep it
    } else if (/^[1-9]$/.test(event.key)) {
      const radio = entry.querySelector(`input[name=pick][data-key="${event.key}"]`);
      if (radio) { radio.checked = true; radio.dispatchEvent(new Event("change")); }
    } else if (event.key === "Enter") {
      event.preventDefault();
      if (!event.repeat) confirm(entry); // a held key confirms one entry, not a run of them
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  followProgress();
  zoomImages();
  reviewQueue();
});
