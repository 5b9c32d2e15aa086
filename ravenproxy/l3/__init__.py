"""ravenproxy.l3 — the L3 route driver.

Pure core (no I/O, tested as data): :mod:`~ravenproxy.l3.cidrs` (merge without widening),
:mod:`~ravenproxy.l3.topology` (domains, central gateway, relay paths),
:mod:`~ravenproxy.l3.state` (immutable kernel objects), :mod:`~ravenproxy.l3.desired`
(model -> desired state), :mod:`~ravenproxy.l3.plan` (actual x desired -> ops), and the text
codecs :mod:`~ravenproxy.l3.iptables`, :mod:`~ravenproxy.l3.ipset`, :mod:`~ravenproxy.l3.xfrm`,
the VPN codecs :mod:`~ravenproxy.l3.ipsec` (strongSwan VICI messages and answers) and
:mod:`~ravenproxy.l3.wireguard` (keys, ``wg show dump``, ``wg set``), and the checks of
:mod:`~ravenproxy.l3.doctor`.

Adapters (thin, root): :mod:`~ravenproxy.l3.apply_iptables`,
:mod:`~ravenproxy.l3.apply_netlink`, :mod:`~ravenproxy.l3.apply_strongswan` (charon over VICI),
:mod:`~ravenproxy.l3.apply_wireguard` (kernel WireGuard or wireguard-go);
:mod:`~ravenproxy.l3.driver` ties them into ``reconcile_once``, the periodic ``Reconciler`` and
``routes_command`` for the CLI; ``doctor.doctor_command`` backs ``ravenproxy doctor``.
"""
