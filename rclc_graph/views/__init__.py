"""What people use from a terminal: the `rclc-graph` command (cli.py), interactive runs with a
progress view and Ctrl-C handling (interactive.py), and the terminal tables (terminal.py).

The top layer: it may import every other layer, but from the executors only what
`rclc_graph.executors` exports (an import-linter contract in pyproject.toml checks it).
"""
