"""Fixtures for training's tests: tiny randomly initialised Llamas with the SmolLM2 tokenizer,
and the toy Domain (tests/support/training.py) registered and at hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.training import LetterDomain
from training.tools.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(base_model, tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), Path(base_model))


@pytest.fixture(scope="session")
def other_tiny_model(base_model, tmp_path_factory) -> Path:
    """Another tiny model (other weights): a held-out user that shares none with the trained."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-other"), Path(base_model), seed=1)


@pytest.fixture(scope="session")
def smooth_tiny_model(base_model, tmp_path_factory) -> Path:
    """A tiny model with Llama's usual small initialisation (0.02): the shared fixture's large
    one makes logits so peaked that float noise from batch shapes swamps a comparison of two
    updates, and at 0.02 bf16's spacing hides steps of 1e-6."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-smooth"), Path(base_model), init_range=0.02
    )


@pytest.fixture(autouse=True)
def letters_registered(monkeypatch):
    """The toy Domain in the registry, so a config naming it passes the domain check."""
    from agents.domains import DOMAINS

    monkeypatch.setitem(
        DOMAINS, LetterDomain.name, f"{LetterDomain.__module__}:{LetterDomain.__name__}"
    )


@pytest.fixture
def letters() -> LetterDomain:
    return LetterDomain()


@pytest.fixture
def tool_letters() -> LetterDomain:
    return LetterDomain(tools=True)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One thread: OpenMP's spinning threads make a shared 2-core machine several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
