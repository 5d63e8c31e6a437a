"""``manage.py serve_agents [--engine vllm|embedded] [--study SLUG | --adapters DIR]
[--replicas N] [--port P]``.

Starts the model servers for a study's arms: N replicas of one engine on consecutive ports from
P, each serving the base model and every arm's adapter (vLLM: one process with --enable-lora
--lora-modules, and runtime adapter loading for checkpoints attached later). Once all answer
/health it registers (or updates) the endpoint, points the study's arms at it, prints one line
per replica and a `ready:` line, and serves until Ctrl-C (or SIGTERM), which stops every
replica's process group. A replica that dies is reported and started again on its port (after
1 s, longer if it keeps dying); the others go on serving. The endpoint keeps replicas added to
it in the admin.

Before a replica counts as up it has prefilled the opening prompt (system prompt, tools,
greeting) of every arm it will serve: the study's arms, or those of the endpoint that lists
the first replica's URL (or is named --name), so no participant's first turn waits for that
prefill (studies.chat.agent_turn.opening_requests).
"""

import json
import logging
import signal
import sys
import time
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Q

from agents.models import ModelEndpoint, Replica, adapters_dir
from agents.paths import base_model_dir, data_dir
from agents.serving.fleet import (
    ENGINES,
    RUNTIME_LORA_RANK,
    restart_replica,
    start_replicas,
    stop_replicas,
)
from agents.serving.process import StartError, Supervised
from agents.serving.vllm import MAX_MODEL_LEN, VLLMNotInstalled
from studies.chat.agent_turn import opening_requests
from studies.models import Arm, Study
from studies.setup.arm_adapters import UnknownAdapter, study_adapters
from studies.setup.arm_endpoints import check_endpoint, point_arms, register_endpoint

log = logging.getLogger(__name__)
# probes of a replica just started again before its stored health is left as the last answered
HEALTH_TRIES = 5


class Command(BaseCommand):
    help = "Serve a study's arms (or a folder of adapters) with vLLM or the embedded engine."

    def add_arguments(self, parser):
        parser.add_argument("--engine", choices=ENGINES, default="vllm", help="Which engine.")
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            "--study", help="Serve every arm's adapter of this study and point its arms here."
        )
        source.add_argument(
            "--adapters", type=Path, help="Serve every adapter folder found in this folder."
        )
        parser.add_argument("--replicas", type=int, default=1, help="Servers, on ports P, P+1...")
        parser.add_argument("--port", type=int, default=8001, help="The first replica's port.")
        parser.add_argument("--host", default="127.0.0.1", help="The address servers listen on.")
        parser.add_argument("--model", type=Path, help="Base model folder (default: SmolLM2's).")
        parser.add_argument(
            "--name",
            help="The endpoint's name in the registry (default: the study's slug; without a "
            "study, the endpoint that already lists the first replica's URL, as `make demo`'s "
            "`default` does, else one named after that URL).",
        )
        parser.add_argument(
            "--max-lora-rank",
            type=int,
            default=RUNTIME_LORA_RANK,
            help="vLLM: the largest rank of adapters loaded while it runs.",
        )
        parser.add_argument(
            "--max-model-len", type=int, default=MAX_MODEL_LEN, help="vLLM: context length."
        )
        parser.add_argument(
            "--startup-timeout", type=float, default=900, help="Seconds to wait for health."
        )

    def handle(self, *args, **options):
        engine, count = options["engine"], options["replicas"]
        if count < 1:
            raise CommandError("--replicas must be at least 1.")
        model_dir = options["model"] or base_model_dir()
        if not (model_dir / "config.json").is_file():
            raise CommandError(f"{model_dir} is not a Hugging Face model folder (no config.json).")
        study = None
        if options["study"]:
            study = Study.objects.filter(slug=options["study"]).first()
            if study is None:
                raise CommandError(f"No study {options['study']!r}.")
        if options["adapters"] and not options["adapters"].is_dir():
            raise CommandError(f"--adapters: {options['adapters']} is not a folder.")
        try:
            loras = study_adapters(study, model_dir.name) if study else {}
        except UnknownAdapter as error:
            raise CommandError(str(error)) from error
        # the embedded engine also serves checkpoints registered later from its adapters folder
        root = options["adapters"]
        if root is None and engine == "embedded":
            root = adapters_dir()
            root.mkdir(parents=True, exist_ok=True)
        engine_options = {"max_model_len": options["max_model_len"]} if engine == "vllm" else {}
        warm = warm_requests(study, options["name"], first_url(options["host"], options["port"]))

        # SIGTERM (a supervisor, `make demo`) stops the servers as Ctrl-C does
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        log_dir = data_dir() / "logs"
        self.stdout.write(
            f"Starting {count} {engine} replica(s) of {model_dir.name} with "
            f"{len(loras)} adapter(s), {len(warm)} opening prompt(s) to warm; logs in {log_dir}"
        )
        try:
            replicas = start_replicas(
                engine,
                model_dir,
                count=count,
                port=options["port"],
                host=options["host"],
                loras=loras,
                adapters_root=root,
                max_lora_rank=options["max_lora_rank"],
                log_dir=log_dir,
                startup_timeout=options["startup_timeout"],
                warm=warm,
                **engine_options,
            )
        except (ValueError, VLLMNotInstalled, StartError) as error:
            raise CommandError(str(error)) from error
        except KeyboardInterrupt:
            return  # start_replicas stopped what it had started
        try:
            urls = [replica.url for replica in replicas]
            with transaction.atomic():
                # the endpoint that lists the first URL, or one named after it (`default` for
                # PARLEY_ENGINE_URL, where `make demo`'s arms point)
                name = options["name"] or (
                    study.slug if study else ModelEndpoint.of_url(urls[0], engine).name
                )
                # replicas stored for it (added in the admin) stay: they serve when ours do not
                endpoint = register_endpoint(name, engine, urls, keep_stored=True)
                if study is not None:
                    point_arms(study, endpoint, None)
            check_endpoint(endpoint)  # its health as of now, in the admin's list
            for number, replica in enumerate(replicas, 1):
                self.stdout.write(f"replica {number}: {replica.url} pid {replica.process.pid}")
            arms = ", ".join(study.arms.values_list("name", flat=True)) if study else "none"
            self.stdout.write(f"ready: endpoint {name} ({engine}); arms pointed here: {arms}")
            self.stdout.flush()
            self.watch(replicas, endpoint)
        except ValidationError as refused:  # an arm's model is not served after all
            raise CommandError("; ".join(refused.messages)) from refused
        except KeyboardInterrupt:
            pass
        finally:  # whatever happens, no server is left behind
            # a second Ctrl-C must not cut the stopping short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stdout.write("Stopping the replicas...")
            stop_replicas(replicas)
            self.stdout.write("Stopped.")

    def watch(self, replicas, endpoint):
        """Serve until interrupted; a replica that stops is reported and started again, and the
        endpoint's stored health follows (a down replica is routed around until then)."""
        watched = [
            (r, Supervised(f"replica {r.url}", r.process, lambda r=r: self.restart(r)))
            for r in replicas
        ]
        while True:
            time.sleep(1)
            for replica, supervised in watched:
                if line := supervised.check():
                    # stored first, so that once the line is out the admin's list says it too;
                    # a replica started again has answered /health already: a probe that times
                    # out on a busy machine is asked again rather than stored as its state
                    running = replica.process.poll() is None
                    self.check_health(endpoint, up=replica.url if running else None)
                    self.stderr.write(line)

    def restart(self, replica):
        restart_replica(replica)
        return replica.process

    def check_health(self, endpoint, up: str | None = None, tries: int = HEALTH_TRIES):
        """Store every replica's health now; `up`: a replica known to be serving, whose probe
        is repeated (1 s apart, `tries` in all) until it reads up."""
        for attempt in range(tries):
            try:
                check_endpoint(endpoint)
                stored = dict(endpoint.replicas.values_list("url", "status"))
            except Exception:  # a database that is away must not stop the serving
                log.exception("could not store the health of endpoint %s", endpoint.name)
                return
            if (
                up is None
                or stored.get(up.rstrip("/")) == Replica.Status.UP
                or attempt == tries - 1
            ):
                return
            time.sleep(1)


def first_url(host: str, port: int) -> str:
    """The first replica's base URL, as start_replicas gives it."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def warm_requests(study: Study | None, name: str | None, url: str) -> list[dict]:
    """The opening requests of the arms this engine will serve: the study's, else the active
    arms of open studies whose endpoint is named `name` or lists `url`."""
    if study is not None:
        arms = study.arms.all()
    else:
        where = Q(endpoint__replicas__url=url.rstrip("/"))
        if name:
            where |= Q(endpoint__name=name)
        arms = Arm.objects.filter(where).exclude(study__status=Study.Status.CLOSED)
    requests = {}
    for arm in arms.filter(active=True).select_related("study").distinct():
        for body in opening_requests(arm):
            requests[json.dumps(body, sort_keys=True)] = body
    return list(requests.values())
