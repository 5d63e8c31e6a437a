"""A replica restarted again and again keeps every instance's log (a demo's engine that kept
crashing had only its last crash's log: each restart wrote over the one before)."""

import sys

from agents.serving.fleet import Replica, restart_replica, stop_replicas
from agents.serving.process import free_port, spawn
from agents.serving.vllm import wait_vllm

# A stand-in replica: answers /health, and says in its log which start it is.
SERVER = """
import http.server, os, sys
print("instance", os.environ["INSTANCE"], flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_every_instance_keeps_its_log(tmp_path):
    port, log = free_port(), tmp_path / "embedded-8001.log"
    starts = []

    def launch() -> Replica:
        starts.append(len(starts) + 1)
        process = spawn(
            [sys.executable, "-c", SERVER, str(port)],
            log,
            env={"INSTANCE": str(starts[-1])},
        )
        url = f"http://127.0.0.1:{port}/v1"
        return Replica(url=url, process=process, launch=launch, startup_timeout=30)

    replica = launch()
    try:
        wait_vllm(replica.url, replica.process, 30)
        restart_replica(replica)
        restart_replica(replica)
        # an earlier run's first crash on the same port stays too
        (tmp_path / "embedded-8001.stopped-9.log").write_text("another run")
    finally:
        stop_replicas([replica])
    assert replica.restarts == 2
    kept = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    assert "instance 1" in kept["embedded-8001.stopped-1.log"]
    assert "instance 2" in kept["embedded-8001.stopped-2.log"]
    assert "instance 3" in kept["embedded-8001.log"]
    assert kept["embedded-8001.stopped-9.log"] == "another run"
