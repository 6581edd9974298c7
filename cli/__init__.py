"""hoptrace.cli."""
