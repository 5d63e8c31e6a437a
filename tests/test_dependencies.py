"""requirements.lock, pyproject.toml's ranges and what is installed agree (issue 42 point 2).

`make install` installs from the lock (pip -c), so CI runs on exactly the locked set; these
tests fail when the lock stops satisfying pyproject.toml, when a framework whose internals
parley leans on loses its minor-version pin, or when the environment has drifted from the lock
(a package upgraded by hand: run `make lock` and the suite, then commit both).
"""

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# The frameworks whose private parts or version-specific keywords parley uses
# (docs/development.md, Framework internals): each pinned to one minor release.
PINNED_MINOR = ["django", "asgiref", "channels", "transformers", "torch", "openai"]


def locked() -> dict[str, Version]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not name==version"
            out[canonicalize_name(name)] = Version(version)
    return out


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    return [Requirement(text) for text in declared]


def test_the_lock_satisfies_every_declared_range():
    lock = locked()
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{requirement.name} is declared in pyproject.toml but not locked"
        assert requirement.specifier.contains(lock[name], prereleases=True), (
            f"requirements.lock has {name}=={lock[name]}, outside pyproject.toml's {requirement}"
        )


def next_minor(version: Version) -> Version:
    return Version(f"{version.major}.{version.minor + 1}")


def test_frameworks_whose_internals_parley_uses_are_pinned_to_a_minor_release():
    lock = locked()
    by_name = {canonicalize_name(r.name): r.specifier for r in requirements()}
    for name in PINNED_MINOR:
        spec: SpecifierSet = by_name[name]
        version = lock[name]
        assert spec.contains(version), f"{name}: the lock's {version} is outside {spec}"
        assert not spec.contains(next_minor(version), prereleases=True), (
            f"{name} {spec} admits {next_minor(version)}: pin it to {version.major}.{version.minor}"
        )


def test_what_is_installed_is_what_is_locked():
    drift = []
    for name, version in locked().items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            drift.append(f"{name}: locked {version}, not installed")
            continue
        # a local label (torch's +cpu) is a build of the same release
        if Version(installed.public) != version:
            drift.append(f"{name}: locked {version}, installed {installed}")
    assert not drift, "the environment differs from requirements.lock (make install): " + "; ".join(
        drift
    )
