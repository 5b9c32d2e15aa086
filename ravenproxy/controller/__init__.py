"""ravenproxy.controller: Raven's gateway controller, and the embedded DNS server.

Pure planners: :mod:`election` (active endpoints, status), :mod:`services`, :mod:`dnsmap`,
:mod:`validation`, :mod:`desired` (all of them together). I/O around them: :mod:`writer` (API
writes), :mod:`reconciler` (the level-triggered loop), :mod:`leader` (leader election),
:mod:`agents` (agent liveness), :mod:`runtime` and :mod:`dryrun` (entry points). DNS:
:mod:`dnsanswer` (sans-I/O), :mod:`dns` (the asyncio server), :mod:`dnsfeed` (what it answers
from). The model comes through :func:`ravenproxy.kube.sources.model_source`, as for every command.
"""
