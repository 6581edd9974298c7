"""hoptrace.dispatcher."""
