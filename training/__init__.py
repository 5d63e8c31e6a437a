"""Multi-turn GRPO against user simulators, in packages named by their job, from the bottom up:

    vocabulary  regimes and the run config's other closed sets, each declared once
    layout      a run folder's file names (config.json, metrics.jsonl, samples.jsonl, exploit.json)
    config      the run's one declared config: its fields in config_schema.py (RunConfig), its
                loading from TOML in config.py (parse_config, load_config)
    rl/         the learning itself: tokens, choice turns, the GRPO loss, the policy, ranks
    rollouts/   conversations: the agent's and the simulator's turns, served models
    regimes/    where the simulator comes from and whether it learns (pool, its rewards)
    measures/   what a step and a run are judged by: collapse, diversity, held-out panel, metrics
    trainer/    the loop that ties the rest together, and its checkpoints
    tools/      what a researcher runs beside training: dry run, paper table, experiments,
                imitation, the tiny test model
    collapse2/  the pre-registered experiment (left where its analysis was registered)

Each imports only the ones listed below it (import-linter's `layers` contract in
pyproject.toml). The split follows what a reader looks for rather than what calls what:
OpenRLHF keeps the loss apart from the rollout machinery the same way, so the loss's formula
is found without reading the conversation code. models.py, admin.py, tasks.py and
migrations/ stay at the top level because Django and Celery look them up there
("training.tasks.*" names the Celery tasks).
"""
