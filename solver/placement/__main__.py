"""`python -m solver.placement INPUT.json OUTPUT.json`: the original program's command line."""

from __future__ import annotations

import argparse
import json
import sys

from .jsonio import solve_document, write_document


def main(argv: list[str] | None = None) -> int:
    """Read the original input schema, write its output schema; exit 2 with one line on bad input."""
    parser = argparse.ArgumentParser(prog="python -m solver.placement", description=__doc__)
    parser.add_argument("input", help="input JSON (original schema)")
    parser.add_argument("output", help="output JSON, written atomically")
    args = parser.parse_args(argv)
    try:
        with open(args.input, encoding="utf-8") as handle:
            document = json.load(handle)
        write_document(solve_document(document), args.output)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
