// The study monitor refreshes itself: the JSON endpoint renders the same body as the page.
(function () {
  const root = document.getElementById("monitor");
  if (!root) return;
  const body = document.getElementById("monitor-body");
  const updated = document.getElementById("monitor-updated");
  const every = parseInt(root.dataset.refreshMs, 10) || 5000;
  async function refresh() {
    try {
      const response = await fetch(root.dataset.refreshUrl, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (!response.ok) throw new Error(response.status);
      const data = await response.json();
      body.innerHTML = data.html;
      body.classList.remove("stale");
      updated.textContent = "Updated " + new Date().toLocaleTimeString() + ".";
    } catch (error) {
      body.classList.add("stale");
      updated.textContent = "Could not refresh (" + error.message + "); trying again.";
    }
  }
  setInterval(refresh, every);
})();
