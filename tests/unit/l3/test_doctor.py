"""Doctor checks on evidence as data: each seed failure found, nothing on a healthy node."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ravenproxy.l3 import doctor, iptables
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.doctor import Evidence, Sample
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import NodeState, Route, Rule

from .models import cloud_and_edge

S = L3Settings(cni_interface="eth0")
FLANNEL = "-A POSTROUTING -s 10.16.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE"
JUMP = "-A POSTROUTING -m comment --comment ravenproxy -j RAVEN-POSTROUTING"
SA = "SA raven-gw-cloud-gw-edge"


def saved(*postrouting: str) -> iptables.Saved:
    lines = ["*nat", ":POSTROUTING ACCEPT [0:0]", ":RAVEN-POSTROUTING - [0:0]", *postrouting]
    lines.append("-A RAVEN-POSTROUTING -s 10.16.0.0/23 -d 10.16.10.0/23 -j ACCEPT")
    return iptables.parse_save("\n".join([*lines, "COMMIT"]))


def sample(rx: int = 100, sent: int = 50, **xfrm: int) -> Sample:
    return Sample(
        xfrm_stat=MappingProxyType({"XfrmInNoPols": 0, "XfrmOutNoStates": 0, **xfrm}),
        tunnel=MappingProxyType({SA: (40, sent)}),
        raven0_rx=rx,
    )


def healthy(node: str = "cloud-gw") -> Evidence:
    desired = desired_state(cloud_and_edge(), node, S)
    return Evidence(
        node=node,
        interval=2.0,
        desired=desired,
        actual=desired,
        saved=saved(JUMP, FLANNEL),
        sysctls=MappingProxyType(
            {
                "net/ipv4/conf/all/rp_filter": "0",
                "net/ipv4/conf/raven0/rp_filter": "2",
                "net/ipv4/conf/eth0/rp_filter": "2",
            }
        ),
        cni_interface="eth0",
        before=sample(),
        after=sample(rx=120, sent=70),
    )


def codes(ev: Evidence) -> list[str]:
    return [f.code for f in doctor.diagnose(ev)]


def test_healthy_gateway_and_member_report_nothing():
    assert doctor.diagnose(healthy()) == []
    member = healthy("cloud-2")
    assert not member.is_gateway
    assert doctor.diagnose(replace(member, after=sample(rx=120, sent=50))) == []


def test_masquerade_before_the_skip_snat_jump():
    ev = replace(healthy(), saved=saved(FLANNEL, JUMP))
    (f,) = doctor.diagnose(ev)
    assert f.code == "snat-before-skip-snat"
    assert "rule 1" in f.evidence[0] and "MASQUERADE" in f.evidence[0]


def test_masquerade_and_no_jump_at_all():
    ev = replace(healthy(), saved=saved(FLANNEL))
    assert codes(ev) == ["snat-before-skip-snat"]
    assert "no jump" in doctor.diagnose(ev)[0].evidence[0]


def test_node_wanting_no_skip_snat_is_not_blamed_for_masquerade():
    ev = replace(healthy(), desired=NodeState(), actual=NodeState(), saved=saved(FLANNEL))
    assert codes(ev) == []


def test_sa_idle_while_members_send():
    ev = replace(healthy(), after=sample(rx=150, sent=50))
    (f,) = doctor.diagnose(ev)
    assert f.code == "sa-idle" and SA in f.summary
    assert "raven0 received 50 packets" in f.evidence[0]


def test_sa_quiet_without_traffic_is_fine():
    assert codes(replace(healthy(), after=sample(rx=101, sent=50))) == []


def test_xfrm_counters_growing():
    ev = replace(healthy(), after=sample(rx=120, sent=70, XfrmInNoPols=3, XfrmOutNoStates=2))
    findings = doctor.diagnose(ev)
    assert [f.code for f in findings] == ["xfrm-errors", "xfrm-errors"]
    assert "XfrmInNoPols" in findings[0].summary and "0 → 3" in findings[0].evidence[0]
    assert "XfrmOutNoStates" in findings[1].summary


def test_strict_rp_filter_on_raven0_or_the_cni_interface():
    ev = healthy()
    strict = dict(ev.sysctls, **{"net/ipv4/conf/raven0/rp_filter": "1"})
    assert codes(replace(ev, sysctls=MappingProxyType(strict))) == ["rp-filter-strict"]
    # conf/all=1 makes an interface left at 0 strict too; at 2 it stays loose.
    both = dict(ev.sysctls, **{"net/ipv4/conf/all/rp_filter": "1"})
    both["net/ipv4/conf/eth0/rp_filter"] = "0"
    (f,) = doctor.diagnose(replace(ev, sysctls=MappingProxyType(both)))
    assert "eth0" in f.summary


def test_missing_route_and_rule():
    ev = healthy("cloud-2")
    actual = NodeState.of(o for o in ev.desired.objects() if not isinstance(o, Route | Rule))
    findings = doctor.diagnose(replace(ev, actual=actual, after=ev.before))
    assert {f.code for f in findings} == {"missing"}
    text = "\n".join(f.render() for f in findings)
    assert "route missing" in text and "rule missing" in text and "table 9027" in text


def test_parsers():
    assert doctor.parse_xfrm_stat("XfrmInError   0\nXfrmInNoPols  171\n") == {
        "XfrmInError": 0,
        "XfrmInNoPols": 171,
    }
    dev = (
        "Inter-|   Receive\n face |bytes packets\n"
        "    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
        "raven0: 881 15 0 0 0 0 0 0 28 1 0 13 0 0 0 0\n"
    )
    assert doctor.parse_rx_packets(dev, "raven0") == 15
    assert doctor.parse_rx_packets(dev, "eth9") is None


def test_report_renders_findings_with_evidence():
    ev = replace(healthy(), saved=saved(FLANNEL, JUMP))
    text = doctor.report(ev, doctor.diagnose(ev))
    assert text.splitlines()[0] == "ravenproxy doctor: node cloud-gw (gateway)"
    assert "[snat-before-skip-snat]" in text
    assert "no known failure" in doctor.report(healthy(), [])
