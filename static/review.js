// The review desk's keyboard and the bulk-approve count. Progressive enhancement: every action is a
// real link or form that works without this file; htmx (when loaded) turns them into in-place swaps.
(function () {
  "use strict";

  function typing(element) {
    return element && (element.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(element.tagName));
  }

  // requestSubmit fires the submit event, so htmx sends it and `required` fields are checked first.
  // A card swapped in a moment ago may not have been wired up by htmx yet: do it now, so a key
  // never falls back to a full page load.
  function wired(element) {
    if (element && window.htmx) window.htmx.process(element);
    return element;
  }

  function submit(form) {
    if (wired(form)) form.requestSubmit();
  }

  function follow(card, key) {
    var link = wired(card.querySelector("[data-key=" + key + "]"));
    if (link) link.click();
  }

  function approve(card) {
    var edit = card.querySelector("[data-edit]");
    // What is on screen is what gets approved: the edited text when the edit box is open.
    if (edit && edit.open) return submit(edit.querySelector("form"));
    var form = card.querySelector("form[data-approve]");
    if (form && !form.querySelector("button[type=submit]").disabled) submit(form);
  }

  function startEditing(card) {
    var edit = card.querySelector("[data-edit]");
    if (!edit) return;
    edit.open = true;
    var text = edit.querySelector("textarea");
    text.focus();
    text.setSelectionRange(text.value.length, text.value.length);
  }

  function focusReason(card) {
    var reason = card.querySelector("form[data-reject] [name=reason]");
    if (reason) reason.focus();
  }

  // A digit picks the rejection reason of that number: from the card, or in the reason box while it
  // is still empty (once words are typed, a digit is part of them).
  function pickReason(card, digit) {
    var choice = card.querySelector("form[data-reject] [data-reason-key='" + digit + "']");
    if (!choice) return false;
    choice.checked = true;
    focusReason(card);
    return true;
  }

  function undoLast() {
    var form = document.querySelector("#focus form[data-undo]:not([hidden])");
    if (form) submit(form);
  }

  function startComment(card) {
    var text = card.querySelector("[data-comment]");
    if (text) text.focus();
  }

  var keys = {
    j: function (card) { follow(card, "j"); },
    k: function (card) { follow(card, "k"); },
    a: approve,
    e: startEditing,
    r: focusReason,
    c: startComment,
  };

  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (typing(target)) {
      if (/^[1-9]$/.test(event.key) && target.name === "reason" && !target.value && target.closest("form[data-reject]")) {
        var owner = target.closest("[data-focus-card]");
        if (owner && pickReason(owner, event.key)) event.preventDefault();
        return;
      }
      if (event.key === "Escape") target.blur();
      else if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && target.closest("form[data-approve-edited]")) {
        event.preventDefault();
        submit(target.form);
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    if (document.body.dataset.shortcuts === "off") return; // turned off on the person's preferences
    if (event.key === "u") { event.preventDefault(); undoLast(); return; }
    var card = document.querySelector("[data-focus-card]");
    if (card && /^[1-9]$/.test(event.key)) {
      if (pickReason(card, event.key)) event.preventDefault();
      return;
    }
    var action = keys[event.key];
    if (!card || !action) return;
    event.preventDefault(); // `r` and `e` would otherwise type their letter into the field they focus
    action(card);
  });

  // List mode: say on the button what approving the ticked rows will do.
  function countSelection(form) {
    var ticked = form.querySelectorAll("input[name=draft]:checked");
    var publishable = form.querySelectorAll("input[name=draft][data-approvable=true]:checked").length;
    var button = form.querySelector("[data-approve-selected]");
    var note = form.querySelector("[data-selection-note]");
    var n = ticked.length;
    button.disabled = n === 0;
    button.textContent = n === 0
      ? "Approve selected drafts"
      : "Approve " + n + " draft" + (n === 1 ? "" : "s") + " — " + publishable + " will be published";
    var refused = n - publishable;
    note.textContent = refused
      ? refused + " of them cannot be approved (invalid or out of date) and will be refused."
      : "";
  }

  function enhanceList(form) {
    var all = form.querySelector("[data-select-all]");
    var boxes = form.querySelectorAll("input[name=draft]");
    if (all) {
      all.hidden = false;
      all.addEventListener("change", function () {
        boxes.forEach(function (box) { box.checked = all.checked; });
        countSelection(form);
      });
    }
    form.addEventListener("change", function () { countSelection(form); });
    countSelection(form);
    // Enter in the reason rejects (the form's first button would approve).
    var reason = form.querySelector("[name=reason]");
    var reject = form.querySelector("[data-testid=reject-selected]");
    if (reason && reject) {
      reason.addEventListener("keydown", function (event) {
        if (event.key !== "Enter") return;
        event.preventDefault();
        reject.click();
      });
    }
  }

  document.querySelectorAll("form[data-bulk-approve]").forEach(enhanceList);

  // A decision is sent once (rule 15): a second click or Enter while the first is on its way does
  // nothing. htmx forms are kept to one request by hx-sync; a plain form is marked when it goes.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches("form[data-approve], form[data-approve-edited], form[data-reject], form[data-bulk-approve], form[data-once]")) return;
    if (form.hasAttribute("hx-post")) return;
    if (form.dataset.sent) { event.preventDefault(); return; }
    form.dataset.sent = "yes";
  });

  // A decision htmx sent that the server refused with no answer for the card (its form expired
  // because the person logged in again, say in another tab: 403; a fault: 500) or that never reached
  // the server: htmx swaps nothing, so without this the click seemed to do nothing at all. Say so,
  // naming the server's page (its title), where the page's messages are shown.
  function sayNothingWasDone(text) {
    var main = document.getElementById("content");
    if (!main) return;
    var list = main.querySelector("ul.messages");
    if (!list) {
      list = document.createElement("ul");
      list.className = "messages";
      list.setAttribute("data-testid", "messages");
      main.insertBefore(list, main.firstChild);
    }
    var old = list.querySelector("[data-refused]");
    if (old) old.remove();
    var item = document.createElement("li");
    item.className = "message message-error";
    item.setAttribute("role", "alert");
    item.setAttribute("data-refused", "");
    item.textContent = text;
    list.appendChild(item);
    item.scrollIntoView({ block: "nearest" });
  }

  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    var title = /<title>([^<]*)<\/title>/.exec(xhr.responseText || "");
    var why = title ? title[1].replace(/\s*·\s*BatchDesk\s*$/, "") : "error " + xhr.status;
    sayNothingWasDone("Nothing was done (" + why + "). Reload the page, look at it again, and decide again.");
  });

  document.addEventListener("htmx:sendError", function () {
    sayNothingWasDone("Nothing was sent: the server could not be reached. Reload the page when it can, and decide again.");
  });

  // Undo is offered until its time runs out; then the card says it can no longer be undone.
  window.setInterval(function () {
    document.querySelectorAll("form[data-undo][data-undo-until]").forEach(function (form) {
      if (form.hidden || Date.now() < Date.parse(form.dataset.undoUntil)) return;
      form.hidden = true;
      var expired = form.parentNode.querySelector("[data-undo-expired]");
      if (expired) expired.hidden = false;
    });
  }, 1000);

  // The open card keeps its hold on the draft while its reviewer is at work: renewed a few times
  // within each hold, only while the page is visible and the person has done something lately.
  // Idle for a few minutes, the hold runs out and another reviewer may be shown the draft.
  var lastActive = Date.now();
  var IDLE_MS = 3 * 60 * 1000;
  ["keydown", "pointerdown", "pointermove", "scroll", "touchstart"].forEach(function (name) {
    document.addEventListener(name, function () { lastActive = Date.now(); }, { passive: true });
  });
  function keepClaim() {
    var card = document.querySelector("[data-focus-card][data-claim-url]");
    if (!card || document.visibilityState !== "visible" || Date.now() - lastActive > IDLE_MS) return;
    var token = JSON.parse(document.body.getAttribute("hx-headers") || "{}")["x-csrftoken"];
    fetch(card.dataset.claimUrl, { method: "POST", headers: { "X-CSRFToken": token }, credentials: "same-origin" })
      .then(function (response) {
        if (response.status !== 409 || card.querySelector("[data-claim-lost]")) return;
        return response.text().then(function (why) {
          var note = document.createElement("p");
          note.className = "error";
          note.setAttribute("role", "alert");
          note.setAttribute("data-claim-lost", "");
          note.textContent = why + " Move on with j.";
          card.insertBefore(note, card.children[1] || null);
        });
      })
      .catch(function () {});
  }
  // A third of the shortest hold there may be (BATCHDESK_CLAIM_SECONDS is at least 10), whichever
  // card the page opened with: every few seconds costs one small request while someone is at work.
  var card = document.querySelector("[data-focus-card][data-claim-url]");
  var seconds = card ? parseFloat(card.dataset.claimSeconds) : 10;
  window.setInterval(keepClaim, Math.max(3, seconds / 3) * 1000);

  // A page the browser brings back from its cache on Back shows no ticks and may be sent again.
  window.addEventListener("pageshow", function (event) {
    if (!event.persisted) return;
    document.querySelectorAll("form[data-bulk-approve]").forEach(function (form) {
      form.querySelectorAll("input[type=checkbox]").forEach(function (box) { box.checked = false; });
      countSelection(form);
    });
    document.querySelectorAll("form[data-sent]").forEach(function (form) { delete form.dataset.sent; });
  });
})();
