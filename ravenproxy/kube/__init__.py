"""Kubernetes plumbing, below the components and above :mod:`ravenproxy.model`.

- :mod:`.client`: the API client factory and raw JSON calls (``KubeError``);
- :mod:`.reflector`: list-then-watch of one resource (410 relists, periodic resync);
- :mod:`.model`: Nodes, Gateways, Pods (and Calico blocks) → a model in a store (``KubeSource``);
- :mod:`.calico`: which pod CIDRs a node really routes on Calico;
- :mod:`.leases`: the agent-liveness Lease names, labels and time format, shared by the server
  that publishes them and the controller that watches them;
- :mod:`.sources`: ``model_source``, the one way every command feeds its model (inventory or
  the API).

Nothing here imports the server, the agent, the controller or the L3 driver.
"""
