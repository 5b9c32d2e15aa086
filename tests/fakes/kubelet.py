"""The kubelet stand-in of the L7 tests and the latency benchmark is product code now
(:mod:`ravenproxy.lab.kubelet`, what ``ravenproxy lab`` runs on every lab node); this module
re-exports it so ``python -m tests.fakes.kubelet`` keeps working. One copy, not two."""

from __future__ import annotations

from ravenproxy.lab.kubelet import build_app, main, serve

__all__ = ["build_app", "main", "serve"]

if __name__ == "__main__":
    main()
