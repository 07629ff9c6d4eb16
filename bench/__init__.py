"""threadline's benchmarks: every speed or size claim, next to a floor or a peer.

``python -m bench --list`` names them; ``python -m bench NAME ...`` runs them
and writes ``bench/results/NAME.json``; ``python -m bench --docs`` writes
docs/benchmarks.md from those files. Each benchmark is a module here with a
``main(run)`` and, in ``NEEDS``, the services it cannot run without.
"""

BENCHMARKS = (
    "append",
    "durable",
    "loop",
    "load",
    "disk",
    "listing",
    "fleet",
    "prepared",
    "watch",
    "peers",
    "sdk_session",
    "cli",
    "viewer",
    "importers",
    "providers",
    "wire",
    "engines",
    "web",
    "privacy",
    "retention",
    "blobs",
    "tenants",
    "usage",
    "search",
    "catalog",
)
