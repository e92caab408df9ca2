// Refreshes the page's live part: fetches the same address with the
// X-Queen-Partial header, which returns only that part, server-rendered and
// escaped. Paused while the tab is hidden.
(function () {
  "use strict";
  var ms = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var live = document.getElementById("live");
  var stamp = document.getElementById("refreshed");
  if (!ms || !live) {
    return;
  }
  var busy = false;
  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, { headers: { "X-Queen-Partial": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        if (stamp) {
          stamp.textContent = "updated " + new Date().toLocaleTimeString();
          stamp.className = "meta";
        }
      })
      .catch(function (err) {
        if (stamp) {
          stamp.textContent = "refresh failed (" + err.message + "), retrying";
          stamp.className = "meta warn";
        }
      })
      .then(function () {
        busy = false;
      });
  }
  window.setInterval(refresh, ms);
})();
