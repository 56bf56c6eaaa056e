"""`rclc-graph` (optionally with a pause point) whose tool-calling nodes are scripted (run as a script).

    RCLC_SCRIPTED_TOOLS='{"support": [...]}' python tests/helpers/scripted_cli.py -- rclc-graph arguments...
    RCLC_SCRIPTED_TOOLS='{"support": [...]}' python tests/helpers/scripted_cli.py [--hold S] POINT MARKER -- arguments...

The first form runs the command; the second is `paused_cli.py`'s (see there). The nodes named
in RCLC_SCRIPTED_TOOLS write the given replies (tests/scripted_tools.py), so a crash test of a
tool loop kills the same loop the uninterrupted run ran.
"""

from __future__ import annotations

import sys

from tests.helpers import paused_cli, scripted_tools


def main() -> int:
    scripted_tools.install_from_env()
    if sys.argv[1:2] == ["--"]:
        from rclc_graph.views.cli import main as cli_main

        return cli_main(sys.argv[2:])
    return paused_cli.main()


if __name__ == "__main__":
    sys.exit(main())
