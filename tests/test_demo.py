"""`make demo` as a newcomer runs it: the launcher on a fresh data folder, on the README's
defaults (SQLite, the in-memory channel layer, no Redis), then every link it prints opened in a
real browser, and Ctrl-C.

Ports are free ones (PARLEY_PORT, PARLEY_ENGINE_PORT, as the README says), the prepared base
model the one `make model` made (PARLEY_BASE_MODEL). It runs in CI's run on the README's
defaults only (no database or service fixture: the demo has its own data folder).
"""

import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from agents.serving.process import free_port
from tests.support.processes import REPO, need
from tests.support.studies import CHROMIUM, FLAGS

pytestmark = [pytest.mark.browser, pytest.mark.model]

STARTED_WITHIN = 600  # seconds: migrate, seed, the engine and the web server on a busy machine
REPLY_WITHIN = 240_000  # ms: a first turn on a tau2 tool prompt, on a loaded 2-core machine


class Demo:
    """`python -m parley.demo` (what `make demo` runs after `make model`) in its own process
    group, as in a terminal, read line by line as it prints."""

    def __init__(self, data: Path, base_model: Path):
        self.web_port, self.engine_port = free_port(), free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            # nothing set, as the README's newcomer: no database, Redis, broker or settings
            if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY")
        }
        env.update(
            PARLEY_DATA_DIR=str(data),
            PARLEY_BASE_MODEL=str(base_model),
            PARLEY_PORT=str(self.web_port),
            PARLEY_ENGINE_PORT=str(self.engine_port),
            PYTHONUNBUFFERED="1",
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "parley.demo"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, text: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            self.output.append(line)
            if text in line:
                return
        pytest.fail(f"the demo never printed {text!r}:\n" + "\n".join(self.output[-60:]))

    def family(self) -> list[psutil.Process]:
        root = psutil.Process(self.process.pid)
        return [root, *root.children(recursive=True)]

    def ctrl_c(self) -> None:
        """Ctrl-C to the launcher alone (`kill -INT`): it must stop every child itself. A
        terminal's Ctrl-C reaches the whole group, so each child would also stop on its own and
        hide a launcher that leaves them running."""
        self.process.send_signal(signal.SIGINT)

    def kill(self) -> None:
        try:
            family = self.family()
        except psutil.NoSuchProcess:
            return
        for process in family:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def demo(tmp_path, base_model):
    need(os.path.exists(CHROMIUM), "needs Debian's chromium")
    started = Demo(tmp_path / "data", Path(base_model))
    yield started
    started.kill()  # only after a failure is anything left


def printed(output: list[str]) -> dict:
    text = "\n".join(output)
    admin = re.search(r"Admin:\s+(\S+)", text)
    password = re.search(r"user: (\S+)\s+password: (\S+)", text)
    links = re.findall(r"Participant:\s+(\S+)", text)
    assert admin and password and links, text
    return {"admin": admin[1], "user": password[1], "password": password[2], "links": links}


def chat_one_turn(page, link: str, shots: Path) -> str:
    """Consent and one streamed turn; the reply's text."""
    page.goto(link)
    page.click("#consent-accept")
    page.wait_for_selector("#text:not([disabled])", timeout=60_000)
    # the greeting (a Domain may open the conversation) is not this turn's reply
    before = page.locator(".msg.assistant").count()
    page.evaluate("""() => { window.seen = []; new MutationObserver(() => {
        const b = document.querySelector('.msg.assistant.streaming');
        if (b) window.seen.push(b.textContent.length); }).observe(document.getElementById('messages'),
        {subtree: true, childList: true, characterData: true}); }""")
    page.fill("#text", "Hello, could you help me please?")
    page.press("#text", "Enter")
    try:  # the turn is over when a finished reply is there (tool cards may come first)
        page.wait_for_function(
            """(before) => document.querySelectorAll('.msg.assistant:not(.streaming)').length > before
                && !document.querySelector('.msg.assistant.streaming')""",
            arg=before,
            timeout=REPLY_WITHIN,
        )
    except Exception:
        page.screenshot(path=str(shots / "stuck.png"))
        notice = page.locator("#notice").inner_text() if page.locator("#notice").count() else ""
        pytest.fail(f"no reply on {link}: notice {notice!r}; page:\n{page.inner_text('body')}")
    assert page.evaluate("window.seen"), "no reply streamed into the chat"
    return page.locator(".msg.assistant").nth(before).inner_text()


def stored_turns(data: Path) -> list[tuple]:
    with sqlite3.connect(f"file:{data / 'parley.sqlite3'}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT p.prolific_pid, m.role FROM studies_message m"
            " JOIN studies_conversation c ON m.conversation_id = c.id"
            " JOIN studies_participant p ON c.participant_id = p.id"
        ).fetchall()


def test_make_demo_as_a_newcomer_runs_it(demo, tmp_path):
    from playwright.sync_api import sync_playwright

    demo.wait_for("Press Ctrl-C to stop.", STARTED_WITHIN)
    shown = printed(demo.output)
    assert f":{demo.web_port}/" in shown["admin"]
    assert len(shown["links"]) == 3, shown["links"]  # an open chat, tau2 retail, P4G
    children = demo.family()
    assert len(children) >= 6, [p.cmdline() for p in children]  # engine, 2 workers, beat, web

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        for link in shown["links"]:
            reply = chat_one_turn(page, link, tmp_path)
            assert reply.strip(), f"an empty reply on {link}"
            pid = re.search(r"PROLIFIC_PID=(\w+)", link)[1]
            roles = [role for who, role in stored_turns(tmp_path / "data") if who == pid]
            assert "user" in roles and "assistant" in roles, (link, roles)

        page.goto(shown["admin"])
        page.fill("#id_username", shown["user"])
        page.fill("#id_password", shown["password"])
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools", timeout=60_000)  # signed in: the admin's header
        assert "Studies" in page.content()
        browser.close()

    demo.ctrl_c()
    gone, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, [f"{p.pid} {p.cmdline()}" for p in alive if p.is_running()]
    assert demo.process.wait(timeout=5) is not None
