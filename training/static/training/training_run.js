// The training run admin: on the add form, choosing a preset fills every field the researcher
// has not changed with the preset's value and shows the whole configuration that will run; on
// a run's page, the progress line refreshes while the run is active.
(function () {
  "use strict";

  function liveProgress() {
    const el = document.getElementById("run-progress");
    if (!el || !el.dataset.url) return;
    async function poll() {
      try {
        const reply = await fetch(el.dataset.url, { credentials: "same-origin" });
        const data = await reply.json();
        el.textContent = data.text;
        if (data.active) setTimeout(poll, 2000);
      } catch (e) { setTimeout(poll, 5000); }
    }
    setTimeout(poll, 2000);
  }

  function presetForm() {
    const preset = document.getElementById("id_preset");
    const shown = document.getElementById("run-config");
    const loaded = document.getElementById("id_loaded_preset");
    if (!preset || !shown || !loaded) return;
    const form = preset.form;
    const edited = new Set();  // fields the researcher changed: a preset never overwrites them
    let timer = null;

    function values() {
      const params = new URLSearchParams();
      for (const el of form.elements) {
        if (!el.name || el.name === "csrfmiddlewaretoken" || el.name === "loaded_preset") continue;
        params.set(el.name, el.value);
      }
      return params;
    }

    async function preview(params) {
      const reply = await fetch(shown.dataset.previewUrl + "?" + params, { credentials: "same-origin" });
      const data = await reply.json();
      if (data.config) shown.textContent = JSON.stringify(data.config, null, 2);
      if (data.error) shown.textContent = "Not valid: " + data.error + (data.config ? "\n\n" + shown.textContent : "");
      return data;
    }

    preset.addEventListener("change", async () => {
      loaded.value = "";
      if (!preset.value) { shown.textContent = "No preset: the fields alone say what runs."; return; }
      const data = await preview(new URLSearchParams({ preset: preset.value }));
      for (const [key, value] of Object.entries(data.fields || {})) {
        const el = document.getElementById("id_" + key);
        if (!el || edited.has(key)) continue;
        el.value = value === null ? "" : value;
      }
      loaded.value = preset.value;  // the fields now show what the researcher keeps
      preview(values());
    });
    form.addEventListener("input", (event) => {
      const name = event.target.name;
      if (!name || name === "preset") return;
      edited.add(name);
      clearTimeout(timer);
      timer = setTimeout(() => preview(values()), 400);
    });
    // A form shown again (after an error) keeps what was posted; a fresh one loads its preset.
    if (preset.value && loaded.value === preset.value) preview(values());
    else if (preset.value) preset.dispatchEvent(new Event("change"));
  }

  document.addEventListener("DOMContentLoaded", () => { liveProgress(); presetForm(); });
})();
