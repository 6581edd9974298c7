"""hoptrace.common: what every part shares and no part owns: the gRPC security layer (TLS, tokens,
interceptors), the API client of the CLI and the web UI, durations, and network-namespace sockets.

It imports no other hoptrace package but the generated API (`hoptrace.v1`, `hoptrace.kernel_abi`), so
every part can import it without loops (checked by import-linter in `make lint`).
"""
