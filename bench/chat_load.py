"""Chat capacity: what the platform adds to the engine's own time to first token, under load.

    python bench/chat_load.py [--quick] [--sizes 1,50,100] [--workers 4] [--turns 3]
                              [--think 5,15] [--out docs/results/chat_load]
    python bench/chat_load.py --cpu-only             # the CPU figures alone
    python bench/chat_load.py --against CHECKOUT     # CPU: this code and CHECKOUT's, side by side
    python bench/chat_load.py --compare-reads        # CPU: compiled reads on and off, side by side
    python bench/chat_load.py --profile              # py-spy: OUT_profile.md

The production layout on this machine: uvicorn workers (DJANGO_DEBUG=0) on PostgreSQL and Redis,
and a fake OpenAI-compatible engine streaming at a fixed rate (fixed time to first token and
token rate), so any time above the engine's own is the platform's. Bot participants
(studies/rehearsal/bots.py) go through the whole flow over HTTP and WebSocket, as a burst (all at once,
no pause) and with think time (a pause before every message). Reported per run: added time to
first token (p50, p95, p99), whole reply time, server CPU (all worker processes) per chat turn
and per participant session, database transactions per turn, and errors. Besides the runs:
server CPU per chat turn alone, and per participant from arrival to completion code (every
page a browser loads, 3 turns). Results go to OUT.json and OUT.md (by default new files
under data/bench/; docs/capacity.md quotes docs/results/chat_load); results already at OUT
are kept (an error says so) unless --overwrite. CPU time is
inflated by other work on the machine, and by how much drifts: compare code with --against,
which measures two servers in alternating rounds in one sitting.

Needs PostgreSQL (database BENCH_DB, default h_load, created if missing) and Redis
(BENCH_REDIS, default redis://127.0.0.1:6379/15). The bench client shares the machine's cores
with the server: on a small machine its own CPU inflates the figures a little.
"""

import argparse
import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"


# --- the engine: fixed time to first token, fixed token rate -----------------------------------


def engine_app(ttft: float, rate: float, tokens: int):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def chunk(model, delta, finish=None):
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        data = {"id": "x", "object": "chat.completion.chunk", "model": model, "choices": [choice]}
        return f"data: {json.dumps(data)}\n\n"

    async def stream(model):
        await asyncio.sleep(ttft)
        yield chunk(model, {"role": "assistant", "content": "Sure"})
        for i in range(tokens - 1):
            await asyncio.sleep(1 / rate)
            yield chunk(model, {"content": f" w{i}"})
        yield chunk(model, {}, "stop")
        yield "data: [DONE]\n\n"

    async def complete(request):
        body = await request.json()
        if not body.get("stream"):
            await asyncio.sleep(ttft + tokens / rate)
            message = {"role": "assistant", "content": "Sure " * tokens}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return JSONResponse({"id": "x", "model": body["model"], "choices": [choice]})
        return StreamingResponse(stream(body["model"]), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])


# --- the server --------------------------------------------------------------------------------


def server_env(args, engine_port: int, secret: str) -> dict:
    return dict(
        os.environ,
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secret,
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_SETTINGS_MODULE="load_settings",
        PYTHONPATH=os.pathsep.join([str(BENCH), str(REPO), os.environ.get("PYTHONPATH", "")]),
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{args.db}",
        REDIS_URL=args.redis,
        PARLEY_ENGINE_URL=f"http://127.0.0.1:{engine_port}/v1",
        PARLEY_LOG_LEVEL="WARNING",
    )


def wait_for(url: str, process: subprocess.Popen, what: str, seconds: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.3)


def start(args, env: dict, engine_port: int, web_port: int) -> list[subprocess.Popen]:
    python = sys.executable
    engine = subprocess.Popen(
        [python, __file__, "--serve-engine", str(engine_port), *engine_flags(args)],
        cwd=REPO,
        env=env,
    )
    web = subprocess.Popen(
        [
            *(python, "-m", "uvicorn", "parley.asgi:application"),
            *("--host", "127.0.0.1", "--port", str(web_port), "--workers", str(args.workers)),
            *("--log-level", "warning", "--no-access-log", "--ws-per-message-deflate", "false"),
        ],
        cwd=REPO,
        env={**env, "WEB_CONCURRENCY": str(args.workers)},  # each worker's database pool share
    )
    wait_for(f"http://127.0.0.1:{engine_port}/v1/chat/completions", engine, "the engine")
    wait_for(f"http://127.0.0.1:{web_port}/healthz", web, "the web server")
    time.sleep(2)  # every worker up, not only the first
    return [engine, web]


def start_other(args, env: dict, web_port: int) -> subprocess.Popen:
    """The web server of another checkout (--against), on the same database, Redis and engine:
    its code, its bench/load_settings.py, this bench. With --compare-reads, this checkout's with
    the compiled reads off (studies/lib/prepared_queries.py: Django's own query path)."""
    other = Path(args.against).resolve() if args.against else REPO
    if args.compare_reads:
        env = {**env, "PARLEY_COMPILED_READS": "0"}
    path = [str(other / "bench"), str(other), str(other / "platform"), env.get("PYTHONPATH", "")]
    web = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "parley.asgi:application"),
            *("--host", "127.0.0.1", "--port", str(web_port), "--workers", str(args.workers)),
            *("--log-level", "warning", "--no-access-log", "--ws-per-message-deflate", "false"),
        ],
        cwd=other,
        env={**env, "PYTHONPATH": os.pathsep.join(path), "WEB_CONCURRENCY": str(args.workers)},
    )
    wait_for(f"http://127.0.0.1:{web_port}/healthz", web, "the other web server")
    time.sleep(2)
    return web


def side_by_side(args, servers: dict, engine_url: str, rounds: int) -> dict:
    """CPU per chat turn and per whole participant of two servers measured in turns: a warm-up
    each, then `rounds` rounds, each server's measurement next to the other's (which goes first
    alternates), so that the machine's other work weighs on both alike."""
    idle = {name: idle_cpu(web, 5) for name, (web, _) in servers.items()}
    for web, url in servers.values():
        turn_cpu(web, url, engine_url, 20, 5, 0.0)
        participant_cpu(web, url, engine_url, 20, 5, args.turns, 0.0)
    figures = {name: {"turn_ms": [], "participant_ms": [], "load": []} for name in servers}
    names = list(servers)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            web, url = servers[name]
            turn = turn_cpu(web, url, engine_url, 20, 5, idle[name])["net"]
            whole = participant_cpu(web, url, engine_url, 20, 5, args.turns, idle[name])["net"]
            figures[name]["turn_ms"].append(turn)
            figures[name]["participant_ms"].append(whole)
            figures[name]["load"].append(load())
            print(f"{name}: {turn} ms a turn, {whole} ms a participant", uptime(), flush=True)
    return figures


def stop(process: subprocess.Popen) -> None:
    """Stop a started server and its workers; kill what still runs after 15 s (open sockets
    can keep uvicorn's graceful shutdown waiting)."""
    import psutil

    family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    process.terminate()
    _, alive = psutil.wait_procs(family, timeout=15)
    for p in alive:
        p.kill()
    process.wait(timeout=10)


def engine_flags(args) -> list[str]:
    return ["--ttft", str(args.ttft), "--rate", str(args.rate), "--tokens", str(args.tokens)]


def cpu_seconds(process: subprocess.Popen) -> float:
    """User + system CPU of the server: the supervisor and every worker."""
    import psutil

    root = psutil.Process(process.pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def transactions() -> int:
    """The database's committed + rolled back transactions so far (PostgreSQL's statistics;
    with autocommit each statement outside an atomic block counts as one)."""
    from django.db import connection

    time.sleep(1.5)  # backends report their statistics about once a second
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


# --- one run -----------------------------------------------------------------------------------


def load_study(slug: str, engine_url: str, turns: int):
    from agents.models import ModelEndpoint
    from studies.models import Arm, Item, Questionnaire, Study

    study = Study.objects.create(
        slug=slug,
        title=f"Load {slug}",
        status=Study.Status.LIVE,
        completion_code="LOADDONE",
        min_exchanges=turns,
        max_exchanges=max(turns, 20),
        target_per_arm=10**6,  # never reached: no analysis runs in the middle of a load run
    )
    endpoint = ModelEndpoint.of_url(engine_url)
    for order, name in enumerate(("a", "b")):
        Arm.objects.create(
            study=study, name=name, order=order, endpoint=endpoint, model_name="fake"
        )
    questionnaire = Questionnaire.objects.create(study=study)
    Item.objects.create(questionnaire=questionnaire, key="helpful", prompt="Helpful?")
    Item.objects.create(
        questionnaire=questionnaire,
        order=1,
        key="attn",
        prompt="Pick 2",
        kind="attention",
        expected_answer="2",
    )
    return study


def one_run(args, web: subprocess.Popen, url: str, engine_url: str, n: int, mode: str) -> dict:
    from studies.rehearsal.bots import Plan, drive, percentiles

    think = args.think if mode == "think" else (0.0, 0.0)
    slug = f"load-{mode}-{n}-{secrets.token_hex(3)}"
    study = load_study(slug, engine_url, args.turns)
    cpu, xacts = cpu_seconds(web), transactions()
    report = asyncio.run(
        drive(Plan.of(study), n, n, url, think=think, progress=not args.no_progress, seed=n)
    )
    cpu = cpu_seconds(web) - cpu
    xacts = transactions() - xacts
    summary = report.to_dict()
    turns = max(summary["turns"], 1)
    added = [t - args.ttft for r in report.runs for t in r.ttft]
    return {
        "participants": n,
        "mode": mode,
        "think_s": list(think),
        "completed": summary["completed"],
        "failed": summary["failed"],
        "turns": summary["turns"],
        "arms": summary["arms"],
        "added_ttft_ms": percentiles(added),
        "reply_ms": summary["reply_ms"],
        "server_cpu_s": round(cpu, 2),
        "cpu_ms_per_turn": round(1000 * cpu / turns, 1),
        "cpu_s_per_session": round(cpu / max(n, 1), 3),
        "db_transactions_per_turn": round(xacts / turns, 1),
        "errors": summary["errors"],
        "seconds": summary["seconds"],
    }


# --- CPU of chat turns alone ------------------------------------------------------------------


def turn_cpu(
    web: subprocess.Popen, url: str, engine_url: str, n: int, turns: int, idle: float
) -> dict:
    """Server CPU per chat turn with nothing else going on: n participants are placed in the
    chat directly (no HTTP), their sockets opened and their histories read; only then is the
    server's CPU read, around n x turns turns (message to status), all participants at once.
    Gross is all the server's CPU over that time; net leaves out its idle CPU (`idle`, CPU
    seconds per second) over the same time."""
    import websockets

    from studies.participation.arrive import arrive
    from studies.participation.consent import give_consent

    study = load_study(f"turns-{secrets.token_hex(3)}", engine_url, turns)
    tokens = []
    for i in range(n):
        params = {"PROLIFIC_PID": f"t{i}", "STUDY_ID": "s", "SESSION_ID": f"t{i}"}
        participant, _ = arrive(study, params)
        tokens.append(str(give_consent(participant, True).token))
    ws = url.replace("http", "ws", 1)

    async def run() -> float:
        sockets = [
            await websockets.connect(f"{ws}/ws/p/{token}/", origin=url, open_timeout=60)
            for token in tokens
        ]
        for socket in sockets:
            while json.loads(await socket.recv())["type"] != "history":
                pass
        await asyncio.sleep(1)  # the connections settled
        before, started = cpu_seconds(web), time.monotonic()

        async def talk(socket):
            for turn in range(turns):
                await socket.send(json.dumps({"type": "message", "id": f"m{turn}", "text": "Hi"}))
                while (kind := json.loads(await socket.recv())["type"]) != "status":
                    if kind == "error":
                        raise SystemExit("a chat turn failed")

        await asyncio.gather(*(talk(socket) for socket in sockets))
        used = cpu_seconds(web) - before
        elapsed = time.monotonic() - started
        for socket in sockets:
            await socket.close()
        return used, elapsed

    used, elapsed = asyncio.run(run())
    return {
        "gross": round(1000 * used / (n * turns), 1),
        "net": round(1000 * (used - idle * elapsed) / (n * turns), 1),
    }


def idle_cpu(web: subprocess.Popen, seconds: float = 10) -> float:
    """The server's CPU seconds per second with nothing to do (its workers' timers and their
    channel layer's listeners): a fixed cost, not a turn's."""
    before = cpu_seconds(web)
    time.sleep(seconds)
    return (cpu_seconds(web) - before) / seconds


# --- CPU of a whole participant ----------------------------------------------------------------


def participant_cpu(
    web: subprocess.Popen, url: str, engine_url: str, n: int, at_once: int, turns: int, idle: float
) -> dict:
    """Server CPU per participant, arrival to completion code: n bots, `at_once` at a time and
    no think time, each going through every page a browser loads (the Prolific link, consent,
    the chat page, `turns` chat turns over the WebSocket and its end, the questionnaire, the
    debrief page, the completion redirect). Gross is all the server's CPU over the run; net
    leaves out its idle CPU over the same time."""
    from studies.rehearsal.bots import Plan, drive

    study = load_study(f"whole-{secrets.token_hex(3)}", engine_url, turns)
    before, started = cpu_seconds(web), time.monotonic()
    report = asyncio.run(drive(Plan.of(study), n, at_once, url, seed=n))
    used, elapsed = cpu_seconds(web) - before, time.monotonic() - started
    if report.failed:
        raise SystemExit(
            f"{report.failed} of {n} participants failed: {report.to_dict()['errors']}"
        )
    return {
        "gross": round(1000 * used / n, 1),
        "net": round(1000 * (used - idle * elapsed) / n, 1),
    }


# --- where the server's CPU goes: py-spy over the workers ---------------------------------------


def py_spy() -> str:
    """The py-spy executable: PY_SPY, else beside this Python, else on PATH."""
    import shutil

    found = os.environ.get("PY_SPY") or shutil.which(
        "py-spy", path=str(Path(sys.executable).parent)
    )
    found = found or shutil.which("py-spy")
    if not found:
        raise SystemExit("--profile needs py-spy (pip install py-spy), or PY_SPY=its path")
    return found


def profile_participants(
    web: subprocess.Popen,
    url: str,
    engine_url: str,
    n: int,
    at_once: int,
    turns: int,
    out: Path,
    header: dict,
) -> dict:
    """Sample every server process with py-spy (the thread holding the GIL, 250 a second)
    while n participants go through the whole flow as in `participant_cpu`; the stacks (py-spy's
    collapsed format) stay in a temporary file, summed up in out.md."""
    import signal
    import tempfile

    from studies.rehearsal.bots import Plan, drive

    study = load_study(f"profile-{secrets.token_hex(3)}", engine_url, turns)
    raw = Path(tempfile.mkdtemp(prefix="chat_load_profile-")) / "stacks.txt"
    rate = 250
    # --gil: only the thread running Python code is sampled; threads waiting (on the database,
    # a queue, the event loop's select) hold no GIL, and py-spy's own idle test misses them.
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(web.pid), "--subprocesses", "--gil"]
        + ["--rate", str(rate), "--format", "raw", "--output", str(raw)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(3)  # attached to every worker
    before = cpu_seconds(web)
    report = asyncio.run(drive(Plan.of(study), n, at_once, url, seed=n))
    used = cpu_seconds(web) - before
    spy.send_signal(signal.SIGINT)
    said, _ = spy.communicate(timeout=60)
    if not raw.exists():
        raise SystemExit(f"py-spy wrote no profile: {said.strip()[-500:]}")
    stacks = read_stacks(raw.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        **header,
        "participants": n,
        "at_once": at_once,
        "turns": turns,
        "failed": report.failed,
        "rate": rate,
        "server_cpu_s": round(used, 2),
        "ms_per_participant_profiled": round(1000 * used / n, 1),
        "samples": sum(stacks.values()),
        "stacks": str(raw),  # a few MB: for speedscope or flamegraph.pl, not for the repository
    }
    out.with_suffix(".md").write_text(profile_markdown(stacks, summary))
    return summary


PROCESSES = re.compile(r'^(process \d+:"[^"]*";)+')


def read_stacks(text: str) -> Counter:
    """py-spy's collapsed stacks: "frame;frame;... count" per line, outermost frame first,
    each frame "function (file:line)"; the lines are dropped, so that each function counts once."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        stack = PROCESSES.sub("", stack)  # --subprocesses' root frames name the processes
        if not stack or not count.isdigit():
            continue
        frames = tuple(re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";"))
        stacks[frames] += int(count)
    return stacks


# Where a frame's file lies decides its module: the site-packages path's first two folders
# (django/template, psycopg/...), or the project's own path.
LIBRARY = re.compile(r"/site-packages/|/lib/python3\.\d+/")


def module_of(frame: str) -> str:
    _, _, where = frame.rpartition(" (")
    path = where.rstrip(")")
    found = list(LIBRARY.finditer(path))
    if found:  # the innermost: a venv's site-packages lies under its lib/python3.x
        parts = path[found[-1].end() :].split("/")
    else:
        parts = Path(path).parts
        for root in ("studies", "agents", "parley", "training"):
            if root in parts:
                parts = parts[parts.index(root) :]
                break
        else:
            parts = parts[-2:]
    parts = [*parts[:-1], parts[-1].removesuffix(".py")]
    return ".".join(parts[:2])


def kind_of(stack: tuple[str, ...]) -> str:
    """What a sample was doing: an HTTP page (Django's handler), a chat socket (the consumer,
    Channels, the channel layer), or the server around them (uvicorn, the event loop)."""
    text = ";".join(stack)
    if "django/core/handlers" in text:
        return "HTTP pages (Django's handler, the view, its database work)"
    if "studies/chat/" in text or "channels/" in text or "channels_redis/" in text:
        return "chat socket (consumer, channel layer, its database work)"
    if "studies/" in text or "django/" in text:
        return "other Django work (thread pool)"
    return "server around them (uvicorn's protocols, the event loop, other)"


def profile_markdown(stacks: Counter, summary: dict, top: int = 40) -> str:
    total = max(sum(stacks.values()), 1)
    own_fn, cum_fn, own_mod, cum_mod, kinds = Counter(), Counter(), Counter(), Counter(), Counter()
    for stack, count in stacks.items():
        own_fn[stack[-1]] += count
        own_mod[module_of(stack[-1])] += count
        for frame in set(stack):
            cum_fn[frame] += count
        for module in {module_of(frame) for frame in stack}:
            cum_mod[module] += count
        kinds[kind_of(stack)] += count

    def share(count):
        return f"{100 * count / total:.1f}%"

    def table(title, counts, n, what="function"):
        rows = [f"### {title}", "", f"| % of samples | {what} |", "|---:|---|"]
        rows += [f"| {share(c)} | `{name}` |" for name, c in counts.most_common(n)]
        return rows + [""]

    s = summary
    lines = [
        "# Where the server's CPU goes: one participant, arrival to completion code",
        "",
        f"`python bench/chat_load.py --profile`, {s['when']} (load average {s['load']}), "
        f"commit {s['commit']}: py-spy sampled every server process ({s['rate']} samples a "
        "second, the thread holding the GIL only: Python running, not waiting) while "
        f"{s['participants']} bot participants, {s['at_once']} at a time with no think time, went "
        f"through the whole flow ({s['turns']} chat turns each); {s['samples']} samples; the "
        f"server used {s['server_cpu_s']} CPU-s under the profiler "
        f"({s['ms_per_participant_profiled']} ms a participant; the profiler slows it, so "
        "this is no measure of the unprofiled cost). *Cumulative*: samples with the function "
        "(or module) anywhere on the stack; *own*: samples where it was running itself. On a "
        "busy machine a thread the kernel sets aside while it holds the GIL is sampled where it "
        "stopped for as long as it waits: one line with dozens of samples (e.g. "
        "`Query.__init__`, `get_language`) is such a pause, not a cost.",
        "",
        "| % of samples | doing |",
        "|---:|---|",
        *(f"| {share(c)} | {k} |" for k, c in kinds.most_common()),
        "",
        *table("Cumulative, by module", cum_mod, 30, "module"),
        *table("Own, by module", own_mod, 25, "module"),
        *table("Cumulative, by function", cum_fn, top),
        *table("Own, by function", own_fn, 25),
    ]
    return "\n".join(lines) + "\n"


# --- SQL statements of one chat turn -----------------------------------------------------------


def queries_per_turn(engine_url: str) -> dict[str, int]:
    """The SQL statements the chat consumer runs, counted in this process (any thread) through
    Django's query log: opening the chat, and one turn (message to status)."""
    import logging

    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.db import connection
    from django.db.backends.signals import connection_created

    from studies.chat.routing import websocket_urlpatterns
    from studies.participation.arrive import arrive
    from studies.participation.consent import give_consent

    statements = []

    class Statements(logging.Handler):
        def emit(self, record):
            if getattr(record, "sql", None):
                statements.append(record.sql)

    def log_queries(connection, **kwargs):
        connection.force_debug_cursor = True

    log = logging.getLogger("django.db.backends")
    handler, level = Statements(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False  # counted, not printed
    connection_created.connect(log_queries)
    study = load_study(f"queries-{secrets.token_hex(3)}", engine_url, 2)
    participant, _ = arrive(study, {"PROLIFIC_PID": "q1", "STUDY_ID": "s", "SESSION_ID": "s"})
    give_consent(participant, True)

    async def chat() -> dict[str, int]:
        app = URLRouter(websocket_urlpatterns)
        socket = WebsocketCommunicator(app, f"/ws/p/{participant.token}/")
        statements.clear()
        await socket.connect(timeout=30)
        await socket.receive_json_from(timeout=30)  # the history
        opened = len(statements)
        counts = {"open_chat": opened}
        for turn in (1, 2):
            statements.clear()
            await socket.send_json_to({"type": "message", "id": f"q{turn}", "text": "Hello"})
            while (await socket.receive_json_from(timeout=30))["type"] != "status":
                pass
            counts[f"turn_{turn}"] = len(statements)
            if turn == 1:  # what they are: SELECT, INSERT, UPDATE, SAVEPOINT, ...
                kinds = Counter(sql.split(None, 1)[0].upper() for sql in statements)
                counts["turn_1_by_kind"] = dict(kinds.most_common())
        await socket.disconnect()
        return counts

    try:
        return asyncio.run(chat())
    finally:
        connection_created.disconnect(log_queries)
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = True
        connection.force_debug_cursor = False


# --- the report --------------------------------------------------------------------------------


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def load() -> str:
    """The machine's load averages (1, 5, 15 min): other work on its cores inflates CPU time."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def uptime() -> str:
    return f"[{now()}, load {load()}]"


def commit() -> str:
    """The code measured: its commit, and "+changes" when the work tree differs from it;
    BENCH_COMMIT names it for a tree that is no git checkout (an exported commit)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "unknown"
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return head.stdout.strip() + (" +changes" if dirty else "")


def markdown(results: dict) -> str:
    setup = results["setup"]
    lines = [
        "# Chat capacity (bench/chat_load.py)",
        "",
        f"Measured {results['when']} (load average {results.get('load', '?')}, commit "
        f"{results.get('commit', '?')}) on {setup['cores']} cores: {setup['workers']} uvicorn "
        "workers (DJANGO_DEBUG=0) on PostgreSQL and Redis; a fake engine with a time to first "
        f"token of {setup['engine_ttft_s'] * 1000:.0f} ms and {setup['engine_rate']:g} tokens/s "
        f"({setup['engine_tokens']} tokens a reply); {setup['turns']} chat turns per participant; "
        "the bench client runs on the same cores. *Added* is the time from sending a message to "
        "its first streamed token, minus the engine's own time to first token.",
        "",
        "| participants | arrival | completed | failed | added TTFT p50 / p95 / p99 (ms) "
        "| whole reply p50 / p95 (ms) | CPU of the run / turns (ms) | CPU per session (s) "
        "| DB transactions per turn | errors |",
        "|---:|---|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for r in results["runs"]:
        a, w = r["added_ttft_ms"], r["reply_ms"]
        mode = "burst" if r["mode"] == "burst" else "think {:g}-{:g} s".format(*r["think_s"])
        errors = "; ".join(f"{n}x {e[:60]}" for e, n in r["errors"].items()) or "none"
        lines.append(
            f"| {r['participants']} | {mode} | {r['completed']} | {r['failed']} "
            f"| {a['p50']} / {a['p95']} / {a['p99']} | {w['p50']} / {w['p95']} "
            f"| {r['cpu_ms_per_turn']} | {r['cpu_s_per_session']} "
            f"| {r['db_transactions_per_turn']} | {errors} |"
        )
    alone = results.get("turns_alone") or {}
    if alone:
        lines += [
            "",
            f"*CPU of the run / turns* is all the server's CPU over a run (arrivals, pages, "
            f"consent and questionnaire included) divided by its chat turns. Chat turns alone "
            f"({alone['participants']} participants already in the chat, {alone['turns']} turns "
            f"at once, three rounds after a warm-up round): "
            f"**{alone['cpu_ms_per_turn']} ms of server CPU per turn** "
            f"(best round, net of the idle server's {alone['idle_cpu_s_per_s']} CPU-s/s; rounds "
            + ", ".join(f"{r['net']}" for r in alone["rounds"])
            + " ms).",
        ]
    whole = results.get("whole_participant") or {}
    if whole:
        lines += [
            "",
            f"**Server CPU per participant (arrival to completion code): "
            f"{whole['cpu_ms_per_participant']} ms** ({whole['participants']} bot participants, "
            f"{whole['at_once']} at a time with no think time, each loading every page a "
            f"browser loads and {whole['turns']} chat turns; best of three rounds after a "
            "warm-up round, net of the idle server's CPU; rounds "
            + ", ".join(f"{r['net']}" for r in whole["rounds"])
            + " ms).",
        ]
    queries = results.get("queries") or {}
    if queries:
        lines += [
            "",
            "SQL statements the chat consumer runs (counted through Django's query log, one "
            f"participant): opening the chat {queries.get('open_chat')}, first turn "
            f"{queries.get('turn_1')} ({queries.get('turn_1_by_kind')}), second turn "
            f"{queries.get('turn_2')}. *DB transactions per "
            "turn* above is PostgreSQL's transaction count over the whole run (arrival, consent, "
            "questionnaire and the pool's own checks included) divided by the chat turns.",
        ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,50,100")
    parser.add_argument("--modes", default="burst,think")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--think", default="5,15", help="seconds before each message: lo,hi")
    parser.add_argument("--ttft", type=float, default=0.2, help="the engine's time to first token")
    parser.add_argument("--rate", type=float, default=50.0, help="the engine's tokens a second")
    parser.add_argument("--tokens", type=int, default=20, help="tokens in every reply")
    parser.add_argument("--quick", action="store_true", help="1 and 20 participants, 2 turns")
    parser.add_argument("--db", default=os.environ.get("BENCH_DB", "h_load"))
    parser.add_argument(
        "--redis", default=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15")
    )
    parser.add_argument(
        "--out",
        help="where the results go (OUT.json and OUT.md; --profile: OUT_profile.md); default "
        "data/bench/chat_load-<UTC time>, new files each run; the committed results are "
        "docs/results/chat_load",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="write over results already at --out"
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--turns-only", action="store_true", help="only the SQL count and the CPU of chat turns"
    )
    parser.add_argument(
        "--cpu-only",
        action="store_true",
        help="only the CPU figures: the SQL count, chat turns alone, a whole participant",
    )
    parser.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="only the CPU per turn and per participant, this code's and CHECKOUT's (e.g. an "
        "exported main) side by side, in alternating rounds",
    )
    parser.add_argument(
        "--compare-reads",
        action="store_true",
        help="only the CPU per turn and per participant of this code with its compiled reads "
        "and without (PARLEY_COMPILED_READS=0), side by side in alternating rounds",
    )
    parser.add_argument("--rounds", type=int, default=6, help="rounds of --against")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only profile the server (py-spy) through whole participants: OUT_profile.md",
    )
    parser.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engine:
        import uvicorn

        app = engine_app(args.ttft, args.rate, args.tokens)
        uvicorn.run(app, host="127.0.0.1", port=args.serve_engine, log_level="warning")
        return
    if args.out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        args.out = str(REPO / "data" / "bench" / f"chat_load-{stamp}")
    taken = [path for path in outputs(args) if path.exists()]
    if taken and not args.overwrite:  # committed results hold hand-written sections too
        parser.error(
            f"{', '.join(map(str, taken))} already exist{'s' if len(taken) == 1 else ''}: "
            "pass --out PATH for new files, or "
            "--overwrite to replace them"
        )
    if args.quick:  # a smoke run of about a minute
        args.sizes, args.turns, args.think = "1,20", 2, "2,4"
    args.think = tuple(float(x) for x in args.think.split(","))
    from agents.serving.process import free_port

    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", args.db], capture_output=True)
    engine_port, web_port = free_port(), free_port()
    env = server_env(args, engine_port, secrets.token_urlsafe(48))
    os.environ.update(env)  # this process signs the bots and reads the results as the server
    sys.path.insert(0, str(BENCH))
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True
    )
    import django

    django.setup()
    processes = start(args, env, engine_port, web_port)
    url, engine_url = f"http://127.0.0.1:{web_port}", env["PARLEY_ENGINE_URL"]
    runs, queries, turns_alone, whole = [], {}, {}, {}
    try:
        if args.against or args.compare_reads:
            port = free_port()
            other = start_other(args, env, port)
            processes.append(other)
            if args.compare_reads:
                names = (f"compiled reads ({commit()})", f"Django's query path ({commit()})")
            else:
                theirs = os.environ.get("BENCH_AGAINST_COMMIT") or args.against
                names = (f"this ({commit()})", f"against ({theirs})")
            servers = {
                names[0]: (processes[1], url),
                names[1]: (other, f"http://127.0.0.1:{port}"),
            }
            figures = side_by_side(args, servers, engine_url, args.rounds)
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            result = {
                "when": now(),
                "load": load(),
                "commit": commit(),
                "against": args.against or "PARLEY_COMPILED_READS=0",
                "figures": figures,
            }
            out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(result), flush=True)
            return
        if args.profile:  # alone: the profiler slows the server, and any figure beside it
            out = Path(args.out)
            profile = out.with_name(out.name + "_profile")
            header = {"when": now(), "load": load(), "commit": commit()}
            participant_cpu(processes[1], url, engine_url, 20, 5, args.turns, 0.0)  # warm-up
            summary = profile_participants(
                processes[1], url, engine_url, 40, 5, args.turns, profile, header
            )
            print("Profile:", json.dumps(summary), uptime(), f"-> {profile}.md", flush=True)
            return
        queries = queries_per_turn(engine_url)
        print("SQL statements:", json.dumps(queries), flush=True)
        idle = idle_cpu(processes[1])
        print(f"Idle server CPU: {idle:.3f} s/s", flush=True)
        # A warm-up round first (each worker's first turns import modules and prepare its
        # statements), then three rounds: CPU time too is inflated by whatever else runs.
        turn_cpu(processes[1], url, engine_url, 20, 5, idle)
        rounds = [turn_cpu(processes[1], url, engine_url, 20, 5, idle) for _ in range(3)]
        turns_alone = {
            "participants": 20,
            "turns": 100,
            "idle_cpu_s_per_s": round(idle, 3),
            "rounds": rounds,
            "cpu_ms_per_turn": min(r["net"] for r in rounds),
        }
        print("Chat turns alone:", json.dumps(turns_alone), uptime(), flush=True)
        if args.turns_only:
            return
        # The same: a warm-up round, then three.
        participant_cpu(processes[1], url, engine_url, 20, 5, args.turns, idle)
        rounds = [
            participant_cpu(processes[1], url, engine_url, 20, 5, args.turns, idle)
            for _ in range(3)
        ]
        whole = {
            "participants": 20,
            "at_once": 5,
            "turns": args.turns,
            "rounds": rounds,
            "cpu_ms_per_participant": min(r["net"] for r in rounds),
        }
        print("Whole participants:", json.dumps(whole), uptime(), flush=True)
        if not args.cpu_only:
            for mode in args.modes.split(","):
                for n in (int(x) for x in args.sizes.split(",")):
                    run = one_run(args, processes[1], url, engine_url, n, mode)
                    runs.append(run)
                    print(json.dumps(run), uptime(), flush=True)
    finally:
        for process in processes:
            stop(process)
    results = {
        "when": now(),
        "load": load(),
        "commit": commit(),
        "setup": {
            "cores": os.cpu_count(),
            "workers": args.workers,
            "turns": args.turns,
            "engine_ttft_s": args.ttft,
            "engine_rate": args.rate,
            "engine_tokens": args.tokens,
        },
        "queries": queries,
        "turns_alone": turns_alone,
        "whole_participant": whole,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


def outputs(args) -> list[Path]:
    """The files this run writes."""
    out = Path(args.out)
    if args.against or args.compare_reads:
        return [out.with_suffix(".json")]
    if args.profile:
        return [out.with_name(out.name + "_profile").with_suffix(".md")]
    return [out.with_suffix(".json"), out.with_suffix(".md")]


if __name__ == "__main__":
    main()
