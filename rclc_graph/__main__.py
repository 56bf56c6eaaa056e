"""`python -m rclc_graph ...` runs the `rclc-graph` command."""

import sys

from .views.cli import main

if __name__ == "__main__":
    sys.exit(main())
