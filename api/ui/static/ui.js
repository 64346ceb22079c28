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

// The review queue: one entry shown at a time.
//   j / k: next / previous entry; 1-9: pick that option; e: edit the answer's text;
//   Enter: confirm (the review is sent, the entry marked, the next one shown).
function reviewQueue() {
  const queue = document.querySelector("[data-queue]");
  if (!queue) return;
  const entries = Array.from(queue.querySelectorAll(".entry"));
  let index = 0;

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

  async function confirm(entry) {
    const form = entry.querySelector("form.review");
    const body = new URLSearchParams(new FormData(form));
    const response = await fetch(form.action, {
      method: "POST",
      body,
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    const status = entry.querySelector(".outcome") || document.createElement("p");
    status.className = "outcome";
    if (response.ok) {
      const reply = await response.json();
      status.textContent = "Reviewed: " + reply.final_answer;
      entry.classList.add("done");
      entry.append(status);
      show(index + 1);
    } else {
      let detail = response.statusText;
      try { detail = (await response.json()).detail; } catch (error) { /* not JSON */ }
      status.textContent = "Not saved: " + detail;
      status.classList.add("error");
      entry.append(status);
    }
  }

  for (const entry of entries) {
    const form = entry.querySelector("form.review");
    form.addEventListener("submit", (event) => { event.preventDefault(); confirm(entry); });
    for (const radio of form.querySelectorAll("input[name=pick]")) {
      radio.addEventListener("change", () => { form.querySelector(".answer-text").value = radio.value; });
    }
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const entry = entries[index];
    const typing = event.target instanceof HTMLInputElement && event.target.type === "text";
    if (typing) {
      if (event.key === "Escape") event.target.blur();
      return; // Enter in the field submits the form (its own submit handler)
    }
    if (event.key === "j") show(index + 1);
    else if (event.key === "k") show(index - 1);
    else if (event.key === "e") {
      event.preventDefault();
      entry.querySelector(".answer-text").focus();
    } else if (/^[1-9]$/.test(event.key)) {
      const radio = entry.querySelector(`input[name=pick][data-key="${event.key}"]`);
      if (radio) { radio.checked = true; radio.dispatchEvent(new Event("change")); }
    } else if (event.key === "Enter") {
      event.preventDefault();
      confirm(entry);
    } else return;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  followProgress();
  zoomImages();
  reviewQueue();
});
