"""Which LoRA adapters an engine serves, by model name.

An adapter is a folder holding `adapter_config.json` (peft's format, which vLLM loads too).
Under an adapters root every such folder is served, named by the `name` field of a
`manifest.json` beside it (parley's checkpoints carry one) or else by its path below the root
(`run-1/step-200`, or just the folder name at the top level). Adapters given explicitly as
NAME=PATH (like vLLM's --lora-modules) are served under that name. The root is scanned again on
every lookup, so checkpoints written while the engine runs are served without a restart.
"""

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
ADAPTER_CONFIG = "adapter_config.json"
# a checkpoint's manifest (its name, kind, step ...): training writes it, serving and the
# Checkpoint registry read it
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Adapter:
    name: str
    path: Path


def parse_lora_option(value: str) -> Adapter:
    """`NAME=PATH` from the command line."""
    name, sep, path = value.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"expected NAME=PATH, got {value!r}")
    return check_adapter(Adapter(name.strip(), Path(path.strip()).expanduser()))


def check_adapter(adapter: Adapter) -> Adapter:
    if not (adapter.path / ADAPTER_CONFIG).is_file():
        raise ValueError(f"{adapter.path} has no {ADAPTER_CONFIG}: not a LoRA adapter folder")
    return adapter


def find_adapters(root: Path | None, explicit: list[Adapter] = ()) -> dict[str, Adapter]:
    """Served name -> Adapter; explicit adapters win over scanned ones with the same name."""
    found: dict[str, Adapter] = {}
    if root is not None and root.is_dir():
        # os.walk follows links: checkpoints are registered as symlinks into the root.
        configs = sorted(
            Path(top) / ADAPTER_CONFIG
            for top, _, files in os.walk(root, followlinks=True)
            if ADAPTER_CONFIG in files
        )
        for config in configs:
            folder = config.parent
            if folder.name.endswith(".partial"):
                continue  # a checkpoint still being written (training/trainer/checkpoint.py): not yet one
            name = _manifest_name(folder) or (
                folder.name if folder == root else folder.relative_to(root).as_posix()
            )
            if name in found:
                log.warning(
                    "Adapter name %r is used by %s and %s; serving the first.",
                    name,
                    found[name].path,
                    folder,
                )
                continue
            found[name] = Adapter(name, folder)
    for adapter in explicit:
        found[adapter.name] = adapter
    return found


def _manifest_name(folder: Path) -> str | None:
    try:
        name = json.loads((folder / MANIFEST).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name.strip() if isinstance(name, str) and name.strip() else None


def serving_args(parser, args) -> tuple[list[Adapter], Path]:
    """The explicit --lora adapters and the --model folder of an engine's command line, checked
    the same way for the embedded engine and vLLM (argparse errors name the bad option)."""
    from agents.paths import base_model_dir

    try:
        loras = [parse_lora_option(value) for value in args.lora]
    except ValueError as error:
        parser.error(f"--lora: {error}")
    if args.adapters and not args.adapters.is_dir():
        parser.error(f"--adapters: {args.adapters} is not a folder")
    model_dir = args.model or base_model_dir()
    if not (model_dir / "config.json").is_file():
        hint = "" if args.model else " Run `python -m agents.serving.prepare` first."
        parser.error(f"--model: {model_dir} is not a Hugging Face model folder.{hint}")
    return loras, model_dir
