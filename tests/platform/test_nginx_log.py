"""platform/deploy/nginx.conf as shipped, run by a real nginx: its access log keeps a client's
network, not their address, and neither a page token nor a query string (docs/privacy.md)."""

import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

from agents.serving.process import free_port
from tests.support.processes import REPO, need


def test_nginx_logs_the_network_and_no_token_or_query(tmp_path):
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    need(nginx is not None, "Debian's nginx (apt-get install nginx-light)")
    port, upstream = free_port(), free_port()
    shipped = (REPO / "platform/deploy/nginx.conf").read_text()
    # the shipped file, with a port of its own, no TLS and the log here (nothing else changed)
    site = (
        shipped.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{port};")
        .replace("listen 80;", f"listen 127.0.0.1:{free_port()};")
        .replace("/var/log/nginx/parley.access.log", str(tmp_path / "access.log"))
        .replace("127.0.0.1:8000", f"127.0.0.1:{upstream}")
    )
    assert site.count(str(tmp_path / "access.log")) == 1 and f"127.0.0.1:{port};" in site
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\naccess_log off;\n{site}\n}}\n"
    )
    (tmp_path / "logs").mkdir()
    command = [nginx, "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path)]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    subprocess.run(command, check=True)
    try:
        for path in (
            "/p/5f0c-token-9a/questionnaire/?PROLIFIC_PID=5f0c0ffee0ddba11c0ffee99",
            "/s/a-study/?PROLIFIC_PID=5f0c0ffee0ddba11c0ffee99&SESSION_ID=s3cr3t",
        ):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
            # 502: no parley behind it; nginx logs the request all the same
            except urllib.error.HTTPError as answered:
                assert answered.code == 502
        log = tmp_path / "access.log"
        for _ in range(50):  # nginx writes the line after the response
            if log.exists() and log.read_text().count("\n") >= 2:
                break
            time.sleep(0.1)
        lines = log.read_text().splitlines()
    finally:
        subprocess.run([*command, "-s", "stop"], check=False)
    assert [re.sub(r"\[[^]]*\] ", "", line).split()[:5] for line in lines] == [
        ["127.0.0.0/24", "-", '"GET', '/p/[token]/questionnaire/"', "502"],
        ["127.0.0.0/24", "-", '"GET', '/s/a-study/"', "502"],
    ]
    text = log.read_text()
    assert "127.0.0.1" not in text and "5f0c" not in text and "s3cr3t" not in text
