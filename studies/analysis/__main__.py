"""``python -m studies.analysis --csv FILE ...``: the analyze command without Django."""

import argparse
import sys

from .cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m studies.analysis",
        description="Welch t-tests with Holm-Bonferroni correction on a CSV of study results.",
    )
    add_arguments(parser)
    output, report = run(vars(parser.parse_args(argv)))
    sys.stdout.write(output)
    for error in report["errors"]:
        print(f"error: {error}", file=sys.stderr)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
