"""hoptrace.lab: the test lab, in a room of its own. Emulated hosts (network namespaces, veth, bridges,
VXLAN), the delay box (latency ground truth), a UDP flood, an InfluxDB launcher, standalone agents, and
LocalCluster (every component on one machine, behind `make demo`), plus the reference path whose spec and
plans the demo, the tests and the benchmarks share.

Product code (the demo), tests and benchmarks import it as a package. It may import every part; no part
but the CLI's demo imports it (import-linter contracts in pyproject.toml).
"""
