"""How large an inventory may be: read by :mod:`ravenproxy.model.inventory` without PyYAML
(a long-running process never imports it) and by :mod:`ravenproxy.model.safeyaml`."""

MAX_INVENTORY_BYTES = 16 * 1024 * 1024
"""Largest inventory accepted: ~20 000 kubectl-printed Nodes fit in 16 MiB."""
