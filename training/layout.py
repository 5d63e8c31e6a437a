"""A run folder's files, each named once: the trainer writes them; the measures, the tools, the
CLI and the experiment runners read them. No imports, so any layer of training can name them.

    <run>/config.json     RUN_CONFIG_FILE  the config the run trained with (RunConfig.to_dict)
    <run>/metrics.jsonl   METRICS_FILE     one row per step (training/measures/metrics.py)
    <run>/samples.jsonl   SAMPLES_FILE     one sampled conversation per task and step
    <run>/exploit.json    EXPLOIT_FILE     the frozen simulator's exploit, found once at the start
                                           (training/measures/collapse.py)

A checkpoint folder's own files are named in training/trainer/checkpoint.py, its manifest's
name in agents/serving/adapters.py (MANIFEST), where serving reads it; the breaker's files in
training/measures/breaker.py. studies cannot import training: its samples.jsonl check
(studies/admin/action_forms.py) spells the name itself.
"""

RUN_CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
EXPLOIT_FILE = "exploit.json"
