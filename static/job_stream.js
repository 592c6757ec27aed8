// The job page's live progress from the job's event stream (GET /api/jobs/{id}/stream, SPEC §6).
// Where the browser has EventSource, the progress panel gives up its 2-second polling and is
// redrawn when the stream says the job's state or counts changed; elsewhere, or for a job that no
// longer moves, the panel stays as the page renders it (htmx polling, or nothing).
(function () {
  "use strict";
  if (!("EventSource" in window)) return;

  var source = null;
  var seen = null;

  function follow(url) {
    if (source) return;
    source = new EventSource(url);
    source.onmessage = function (message) {
      if (message.data === seen) return; // a reconnection says again what was already shown
      seen = message.data;
      var panel = document.getElementById("job-progress");
      if (panel && window.htmx) window.htmx.trigger(panel, "job-changed");
    };
  }

  function stop() {
    if (source) source.close();
    source = null;
  }

  // Before htmx sets up the panel (the page's own, and each one it swaps in), its polling gives way
  // to the stream; a panel without a stream address belongs to a job that stopped moving.
  document.addEventListener("htmx:beforeProcessNode", function (event) {
    var panel = event.target;
    if (!panel || panel.id !== "job-progress") return;
    var url = panel.getAttribute("data-stream-url");
    if (!url) {
      stop();
      return;
    }
    panel.setAttribute("hx-trigger", "job-changed");
    panel.setAttribute("data-live", "stream");
    follow(url);
  });
})();
