"""The real ASGI server (uvicorn) in its own process with its log kept, and a TCP relay in front of
PostgreSQL that can be cut and restored: what the server logs and how it rides out an outage are
only seen in the real process."""

import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from agents.serving.process import free_port, stop
from tests.support.processes import REPO, child_env


class LoggedServer:
    """uvicorn on the test database (or `database_url`), stdout and stderr in `log`."""

    def __init__(self, log: Path, database_url: str | None = None, **env):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = child_env(**env)
        if database_url:
            env["DATABASE_URL"] = database_url
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "parley.asgi:application",
                "--port",
                str(self.port),
                "--timeout-graceful-shutdown",
                "2",
            ],
            cwd=REPO,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=2)
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    stop(self.process)
                    raise AssertionError("no server:\n" + self.text()[-3000:]) from None
                time.sleep(0.2)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, line: str, timeout: float = 20, also: str | None = None) -> None:
        """Until the log holds `line` (the server's own word that it did something), or `also`
        when given (the word that it failed instead)."""
        deadline = time.monotonic() + timeout
        while line not in (text := self.text()) and (also is None or also not in text):
            assert time.monotonic() < deadline, f"no {line!r} in the log:\n{self.text()[-3000:]}"
            time.sleep(0.05)

    def stop(self) -> None:
        stop(self.process, timeout=10)


class Relay:
    """A TCP relay to `target` (host, port). `cut()` resets every connection through it and
    refuses new ones, as PostgreSQL restarting does; `restore()` listens again on the same port."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = free_port()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        self.listener = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self.accept, args=(listener,), daemon=True).start()

    def accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut: the listener is closed
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    @staticmethod
    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        try:  # wakes the accepting thread (close alone leaves it waiting, still accepting)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for client, upstream in pairs:
            for end in (client, upstream):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def close(self) -> None:
        self.cut()


def relayed_database_url(relay: Relay) -> str:
    """The test database's URL with the relay's port in place of PostgreSQL's."""
    url = child_env()["DATABASE_URL"]
    head, _, rest = url.rpartition("@")
    host_port, _, name = rest.partition("/")
    return f"{head}@127.0.0.1:{relay.port}/{name}"


def postgres_address() -> tuple[str, int]:
    from django.db import connection

    settings = connection.settings_dict
    return settings.get("HOST") or "127.0.0.1", int(settings.get("PORT") or 5432)
