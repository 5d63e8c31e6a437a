// The participant's chat: stream the agent's reply, resend unacknowledged messages after a
// reconnect (same id, so the server never stores them twice), show tool calls as cards.
(function () {
  "use strict";
  const cfg = window.PARLEY;
  const $ = (id) => document.getElementById(id);
  const list = $("messages"), text = $("text"), send = $("send"), end = $("end"), notice = $("notice");
  const pendingKey = "parley-pending-" + cfg.token;
  let socket = null, retries = 0, busy = false, redirecting = false, streaming = null, lastStatus = {};
  let lastSent = null;  // the id of the last message frame, dropped if the server closes on it
  let lastErrorAt = 0;  // when a refusal or an end was last shown (readable before a redirect)

  // The message limit, said as the participant types: no maxlength, which cuts a pasted text
  // mid-word without a word; an over-long message stays whole and is not sent until shortened.
  const maxChars = Number(text.dataset.maxChars), charCount = $("char-count");
  const typed = () => Array.from(text.value.trim()).length;  // code points, as the server counts
  const tooLong = () => typed() > maxChars;
  function showCount() {
    const n = typed();
    charCount.classList.toggle("over", n > maxChars);
    charCount.textContent = n > maxChars
      ? "Your message is " + n + " characters, " + (n - maxChars) + " over the limit of " + maxChars + ": please shorten it to send it."
      : n + " / " + maxChars + " characters";
    updateControls();
  }

  // The time limit: the server's seconds_left (page, history and status events) counted down
  // on this page's clock; a warning two minutes before, and the composer closes at zero.
  const WARN_SECONDS = 120;
  const timeLeft = $("time-left"), timeWarning = $("time-warning");
  let deadline = performance.now() + Number(timeLeft.dataset.secondsLeft) * 1000;
  const secondsLeft = () => Math.max(0, Math.round((deadline - performance.now()) / 1000));
  function setSecondsLeft(seconds) {
    if (typeof seconds === "number") deadline = performance.now() + seconds * 1000;
  }
  function tick() {
    const left = secondsLeft();
    const mm = Math.floor(left / 60), ss = String(left % 60).padStart(2, "0");
    timeLeft.textContent = "Time left: " + mm + ":" + ss + " (limit " + timeLeft.dataset.limitMinutes + " minutes)";
    if (left === 0) {
      timeWarning.hidden = false;
      timeWarning.textContent = "The time for this study is up. Messages sent now are not part of the chat.";
      updateControls();
      if (!redirecting) setTimeout(() => { if (!redirecting) location.reload(); }, 4000);
      return;  // the reload shows the next step; no more ticks
    }
    if (left <= WARN_SECONDS) {
      timeWarning.hidden = false;
      timeWarning.textContent = "About " + Math.ceil(left / 60) + " minute(s) left: please finish your conversation soon.";
    }
    setTimeout(tick, 1000);
  }

  const pending = () => JSON.parse(localStorage.getItem(pendingKey) || "{}");
  const savePending = (p) => localStorage.setItem(pendingKey, JSON.stringify(p));
  const newId = () => "m-" + Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");

  function bubble(role, content, extra) {
    const div = document.createElement("div");
    div.className = "msg " + role + (extra ? " " + extra : "");
    div.textContent = content;
    list.appendChild(div);
    list.scrollTop = list.scrollHeight;
    return div;
  }

  function toolCard(call) {
    const card = document.createElement("div");
    card.className = "tool-card";
    card.dataset.callId = call.id || "";
    const name = document.createElement("div");
    name.className = "tool-name";
    name.textContent = "⚙ " + ((call.function && call.function.name) || "tool");
    const args = document.createElement("div");
    args.className = "tool-args";
    args.textContent = (call.function && call.function.arguments) || "";
    card.append(name, args);
    list.appendChild(card);
    return card;
  }

  function toolResult(message) {
    const cards = list.querySelectorAll(".tool-card");
    let card = Array.from(cards).find((c) => !c.querySelector(".tool-result"));
    if (!card) card = toolCard({ function: { name: message.tool_name } });
    const result = document.createElement("details");
    result.className = "tool-result";
    const summary = document.createElement("summary");
    summary.textContent = message.content.startsWith("Error") ? "error" : "result";
    const body = document.createElement("pre");
    body.textContent = message.content;
    result.append(summary, body);
    card.appendChild(result);
  }

  function render(message) {
    if (message.role === "tool") return toolResult(message);
    if (message.content && message.content.trim()) bubble(message.role, message.content).dataset.clientId = message.client_id || "";
    (message.tool_calls || []).forEach(toolCard);
  }

  function setBusy(value) {
    busy = value;
    updateControls();
  }

  function updateControls() {
    const open = socket && socket.readyState === WebSocket.OPEN;
    const canSend = open && !busy && lastStatus.can_send !== false && secondsLeft() > 0;
    text.disabled = !canSend;
    send.disabled = !canSend || tooLong();
    end.disabled = !open || busy || !lastStatus.can_end;
    if (lastStatus.max_exchanges) {
      $("exchange-count").textContent = "Messages sent: " + (lastStatus.sent || 0) + " of at most " + lastStatus.max_exchanges +
        (lastStatus.can_end ? "" : " (send at least " + lastStatus.min_exchanges + " before ending)");
    }
  }

  // A notice is an error (refused, failed, lost) unless said to be news ("info": the engine slow, the chat over).
  function showNotice(message, retryId, info) {
    notice.hidden = false;
    notice.classList.toggle("info", Boolean(info));
    notice.textContent = message + " ";
    if (retryId) {
      const button = document.createElement("button");
      button.textContent = "Retry";
      button.id = "retry";
      button.onclick = () => { notice.hidden = true; transmit(retryId, pending()[retryId] || button.dataset.text); };
      button.dataset.text = (list.querySelector('[data-client-id="' + retryId + '"]') || {}).textContent || "";
      notice.appendChild(button);
    }
  }

  function transmit(id, body) {
    setBusy(true);
    lastSent = id;
    socket.send(JSON.stringify({ type: "message", id: id, text: body }));
  }

  // The server refused the message for good: never resend it (a resend loop locks the chat).
  function dropPending(id) {
    const p = pending(); delete p[id]; savePending(p);
    const el = list.querySelector('[data-client-id="' + id + '"]');
    if (el) { el.classList.remove("unconfirmed"); el.classList.add("refused"); }
  }

  function onEvent(event) {
    switch (event.type) {
      case "history": {
        list.textContent = "";
        event.messages.forEach(render);
        lastStatus = event;
        setSecondsLeft(event.seconds_left);
        const known = new Set(event.messages.map((m) => m.client_id));
        const unsent = Object.entries(pending()).filter(([id]) => !known.has(id));
        const p = pending();
        Object.keys(p).forEach((id) => { if (known.has(id)) delete p[id]; });
        savePending(p);
        setBusy(false);
        unsent.forEach(([id, body]) => { bubble("user", body, "unconfirmed").dataset.clientId = id; transmit(id, body); });
        break;
      }
      case "ack": {
        if (event.id === lastSent) lastSent = null;
        const p = pending(); delete p[event.id]; savePending(p);
        const el = list.querySelector('[data-client-id="' + event.id + '"]');
        if (el) el.classList.remove("unconfirmed");
        break;
      }
      case "start":
        streaming = bubble("assistant", "", "streaming");
        setBusy(true);
        break;
      case "slow":  // the engine is slow to start: say so, keep waiting
        showNotice(event.message, null, true);
        break;
      case "delta":
        if (!streaming) streaming = bubble("assistant", "", "streaming");
        notice.hidden = true;
        streaming.textContent += event.text;
        list.scrollTop = list.scrollHeight;
        break;
      case "tool_calls":
        if (streaming) { if (event.message.content) { streaming.textContent = event.message.content; streaming.classList.remove("streaming"); } else streaming.remove(); }
        streaming = null;
        (event.message.tool_calls || []).forEach(toolCard);
        break;
      case "tool_result":
        toolResult(event.message);
        break;
      case "reply":
        if ((event.message.content || "").trim()) {
          if (!streaming) streaming = bubble("assistant", "");
          streaming.textContent = event.message.content;
          streaming.classList.remove("streaming");
        } else {  // the agent said nothing, asked twice: no empty bubble, the server's notice instead
          if (streaming) streaming.remove();
          if (event.notice) showNotice(event.notice, null, true);
        }
        streaming = null;
        setBusy(false);
        break;
      case "status":
        lastStatus = event;
        setSecondsLeft(event.seconds_left);
        setBusy(false);
        break;
      case "error":
        if (streaming) { streaming.remove(); streaming = null; }
        if (event.drop && event.reply_to) dropPending(event.reply_to);
        setBusy(false);
        lastErrorAt = Date.now();
        showNotice(event.message, event.retry ? event.reply_to : null);
        break;
      case "superseded":
        redirecting = true;  // do not reconnect: the newer window owns the chat
        setBusy(true);
        showNotice(event.message);
        break;
      case "withdrawn":  // the server ended the chat: the redirect that follows asks about the data
        redirecting = true;
        setBusy(true);
        break;
      case "ended":  // the task is over (e.g. a donation): the agent's last reply stays readable
        showNotice("The conversation is over. Taking you to the next step…", null, true);
        lastErrorAt = Date.now();
        break;
      case "redirect": {
        redirecting = true;
        // A message the server never took is said so, never dropped silently; a refusal just
        // shown stays readable a moment before the page moves on.
        const unsent = Object.keys(pending());
        unsent.forEach(dropPending);
        let url = event.url;
        if (unsent.length) {
          showNotice(secondsLeft() === 0
            ? "The time for this study is up, so your last message was not sent."
            : "The chat is closed, so your last message was not sent.");
          lastErrorAt = Date.now();
          url += (url.includes("?") ? "&" : "?") + "unsent=1";  // the next page says why
        }
        setBusy(true);
        const wait = Date.now() - lastErrorAt < 3000 ? 4000 : 0;
        setTimeout(() => { window.location.href = url; }, wait);
        break;
      }
    }
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + cfg.socket);
    socket.onopen = () => { retries = 0; notice.hidden = true; updateControls(); };
    socket.onmessage = (m) => onEvent(JSON.parse(m.data));
    socket.onclose = (e) => {
      updateControls();
      if (redirecting) return;
      // Closed for the frame itself (unsupported, invalid, policy, too big): resending it would
      // only close the socket again, so it is dropped.
      if ([1003, 1007, 1008, 1009].includes(e.code) && lastSent) { dropPending(lastSent); lastSent = null; }
      if (e.code === 4404) { showNotice("This chat cannot be found. Please reopen the study link."); return; }
      streaming = null;
      retries += 1;
      showNotice("Connection lost; reconnecting…");
      setTimeout(connect, Math.min(1000 * retries, 10000));
    };
  }

  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const body = text.value.trim();
    if (!body || busy || tooLong()) return;
    const id = newId();
    const p = pending(); p[id] = body; savePending(p);
    bubble("user", body, "unconfirmed").dataset.clientId = id;
    text.value = "";
    showCount();
    notice.hidden = true;
    transmit(id, body);
  });
  text.addEventListener("input", showCount);
  text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  // Stop taking part: over the socket when it is open (the chat ends at once, in the order of
  // the messages before it), else the link's page, which asks to confirm and works without it.
  const stop = $("stop-taking-part");
  if (stop) stop.addEventListener("click", (click) => {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    click.preventDefault();
    if (confirm("Stop taking part? The conversation ends now and cannot be continued. Next, you choose whether we may keep what you have given so far.")) {
      socket.send(JSON.stringify({ type: "withdraw" }));
    }
  });
  end.addEventListener("click", () => {
    if (confirm("End the conversation and go on to the questions?")) socket.send(JSON.stringify({ type: "end" }));
  });
  connect();
  tick();
})();
