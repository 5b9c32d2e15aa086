"""Kubernetes plumbing, below the components and above :mod:`ravenproxy.model`.

- :mod:`.kubeconfig`: where the API is and who we are to it (a kubeconfig, or the pod's
  service account);
- :mod:`.rest`: our REST client, HTTP/1.1 and JSON on asyncio streams (``KubeError``); the
  agent, the server (model, agent Leases) and every certificate requester use it;
- :mod:`.client`: the kubernetes_asyncio client factory and raw JSON calls, for the controller
  and the dns command (it loads kubernetes_asyncio and aiohttp, ~48 MB);
- :mod:`.reflector`: list-then-watch of one resource (410 relists, periodic resync);
- :mod:`.model`: Nodes, Gateways, Pods (and Calico blocks) → a model in a store (``KubeSource``);
- :mod:`.calico`: which pod CIDRs a node really routes on Calico;
- :mod:`.leases`: the agent-liveness Lease names, labels and time format, shared by the server
  that publishes them and the controller that watches them;
- :mod:`.sources`: ``model_source``, the one way every command feeds its model (inventory or
  the API).

Nothing here imports the server, the agent, the controller or the L3 driver.
"""
