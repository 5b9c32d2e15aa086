"""``ravenproxy lab``: a cloud and a NAT'd edge on one machine, in network namespaces.

- :mod:`.plan` — the topology as data (pure: every name and address from the lab's NAME);
- :mod:`.netns` — the applier: namespaces, veths, bridges, routes, iptables, resolv.conf;
- :mod:`.supervisor` — processes in namespaces, PID files under the lab's directory;
- :mod:`.keeper` — restarts one process when it dies (as a kubelet restarts a pod);
- :mod:`.state` — the state file that ``status``/``check``/``fault``/``down`` read;
- :mod:`.kubelet`, :mod:`.exporter` — the kubelet stand-in and the edge pod's exporter;
- :mod:`.probe` — the client side of the checks that curl cannot do (exec, UDP echo);
- :mod:`.checks` — ``lab check`` rows; :mod:`.faults` — ``lab fault``;
- :mod:`.command` — the CLI adapter (up, status, exec, check, fault, down).
"""
