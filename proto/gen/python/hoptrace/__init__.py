"""hoptrace: a distributed packet tracer for virtualized networks.

Installed layout: hoptrace.dispatcher, hoptrace.collector, hoptrace.web and
hoptrace.cli come from the repository's top-level folders; hoptrace.v1 is the
code generated from proto/ (make proto).
"""

__version__ = "0.1.0"
