// `?` shows the review desk's keys over the page (templates/_keys_help.html); `?` again or Esc
// closes it. Never while the person types in a field: there `?` is a question mark.
(function () {
  "use strict";

  var help = document.getElementById("keys-help");
  if (!help || typeof help.showModal !== "function") return;

  function typing(element) {
    return element && (element.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(element.tagName));
  }

  function toggle() {
    if (help.open) help.close();
    else help.showModal();
  }

  var opener = document.querySelector("[data-keys-help-open]");
  if (opener) {
    opener.hidden = false; // a button for touch screens, where there is no `?` key
    opener.addEventListener("click", toggle);
  }

  // Capturing, so that while the list is open the desk's own keys (`a` approves) do nothing.
  window.addEventListener("keydown", function (event) {
    if (event.key === "?" && !event.ctrlKey && !event.metaKey && !event.altKey && !event.repeat && !typing(event.target)) {
      event.preventDefault();
      event.stopPropagation();
      toggle();
    } else if (help.open && event.key !== "Escape" && event.key !== "Tab") {
      event.stopPropagation();
    }
  }, true);
})();
