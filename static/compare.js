// The blind comparison's keys: 1 prefers the left draft, 2 the right, b both, n neither. Progressive
// enhancement: each is a real submit button that works without this file; htmx (when loaded) swaps the
// next pair in place.
(function () {
  "use strict";

  function typing(element) {
    return element && (element.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(element.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (typing(event.target) || event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    if (document.body.dataset.shortcuts === "off") return; // turned off on the person's preferences
    var form = document.querySelector("form[data-compare-form]");
    if (!form) return;
    var button = form.querySelector("button[data-key='" + event.key.toLowerCase() + "']");
    if (!button) return;
    event.preventDefault();
    if (window.htmx) window.htmx.process(form);
    // A click, as a person's: the form goes with the button's name and value (htmx learns which
    // button sent a form from its click).
    button.click();
  });

  // An answer is sent once (rule 15): without htmx, a second click while the first is on its way
  // does nothing (htmx forms are kept to one request by hx-sync); the server records once besides.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches("form[data-compare-form]") || form.hasAttribute("hx-post")) return;
    if (form.dataset.sent) { event.preventDefault(); return; }
    form.dataset.sent = "yes";
  });
})();
