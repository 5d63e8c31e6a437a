"""`make lint`'s dependency audit: pip-audit over the installed set, failing on a known vulnerability.

pip-audit asks PyPI's JSON API (or OSV) about each package. Where that service cannot be reached
(a machine that sees only a package mirror), pip-audit reports every package as "not found" and
says "No known vulnerabilities found": this reports plainly that nothing was audited instead,
and fails only on vulnerabilities actually found, unless PARLEY_AUDIT_STRICT=1 asks for an
audit that must reach the database.

    python -m parley.audit
"""

import json
import subprocess
import sys

from agents.environment import setting

PARLEY_AUDIT_STRICT = setting(
    "PARLEY_AUDIT_STRICT",
    "bool",
    False,
    help="`make lint`'s dependency audit (`python -m parley.audit`) fails when the "
    "vulnerability database cannot be reached, instead of saying that nothing was audited",
)


def pip_audit() -> tuple[dict | None, str]:
    """pip-audit's JSON report of this environment (None if it produced none), and its stderr."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip_audit",
            "--local",
            "--skip-editable",  # parley itself is not on PyPI
            "--progress-spinner",
            "off",
            "--format",
            "json",
            "--timeout",
            "15",
        ],
        capture_output=True,
        text=True,
    )
    try:
        return json.loads(result.stdout), result.stderr
    except json.JSONDecodeError:
        return None, result.stderr


def main() -> int:
    strict = PARLEY_AUDIT_STRICT.read()
    report, errors = pip_audit()
    if report is None:
        last = errors.strip().splitlines()[-1:] or ["no output"]
        print(f"pip-audit: the vulnerability database could not be reached ({last[0]})")
        print("pip-audit: NOTHING WAS AUDITED")
        return 1 if strict else 0
    # parley itself (installed editable) is not on PyPI and is not counted.
    packages = [p for p in report["dependencies"] if "editable" not in p.get("skip_reason", "")]
    vulnerable = [p for p in packages if p.get("vulns")]
    unaudited = [p for p in packages if "skip_reason" in p]
    for package in vulnerable:
        for vuln in package["vulns"]:
            fixed = ", ".join(vuln.get("fix_versions", [])) or "no fixed version yet"
            print(
                f"pip-audit: {package['name']} {package['version']}: {vuln['id']} (fixed in {fixed})"
            )
    audited = len(packages) - len(unaudited)
    if unaudited:
        print(
            f"pip-audit: the vulnerability database did not answer for {len(unaudited)} of "
            f"{len(packages)} packages (e.g. {unaudited[0]['skip_reason']}): those were NOT audited"
        )
    print(f"pip-audit: {audited} packages audited, {len(vulnerable)} with known vulnerabilities")
    if vulnerable:
        return 1
    return 1 if strict and unaudited else 0


if __name__ == "__main__":
    sys.exit(main())
