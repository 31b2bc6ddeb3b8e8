"""``python -m ts_microbatch.agent``: the line that enables the agent in config.properties.

Prints ``vmargs=-javaagent:<path of the jar>``; with ``--path``, the path alone. Exits 1,
saying why, when the jar is not built.
"""

from __future__ import annotations

import argparse
import sys

from . import jar_path, missing, vmargs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ts_microbatch.agent", description=__doc__)
    parser.add_argument("--path", action="store_true", help="print the jar's path alone")
    args = parser.parse_args(argv)
    problem = missing()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(jar_path() if args.path else f"vmargs={vmargs()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
