"""`python -m rclc doctor [--backend hf|vllm] [--allow-unstable]`: print `rclc.check()` as JSON.

Exit status: 0 when no issues were found, 1 when the report lists issues, 2 for bad
arguments. Nothing is downloaded, converted or run.
"""

from __future__ import annotations

import argparse
import json
import sys

from .doctor import BACKENDS, check


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rclc", description="rclc transfer-core tools")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser("doctor", help="check versions and the environment; print JSON with fixes")
    doctor.add_argument("--backend", choices=BACKENDS, default="hf", help="backend to check (default: hf)")
    doctor.add_argument(
        "--allow-unstable", action="store_true", help="accept the opt-in unstable vLLM release (vllm backend only)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        report = check(backend=arguments.backend, allow_unstable=arguments.allow_unstable or None)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
