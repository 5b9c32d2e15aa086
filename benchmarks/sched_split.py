"""hops.py ``--sched``: where a relay's time goes between the calls of a batch, from the
scheduler's own record (``perf record -a -e sched:sched_switch -e sched:sched_wakeup``) laid
over the relay's syscalls.

A relay thread is either on a CPU or off it; off it, it was switched out runnable (``prev_state``
R: **preempted**, the whole gap waits for a CPU), or asleep (S/D) until a ``sched_wakeup`` and
then **woken** but waiting for a CPU until switched back in. Any stretch of the relay's time
(:func:`split`) is so cut into ``asleep``, ``woken_waiting``, ``preempted``, and on-CPU time,
which the relay's syscalls cut further: on-CPU inside a syscall, by what the call was (a write to
the batch's sockets, a read of the socket the batch came in on, the loop's wait, ...), and the
rest, ``user``: the interpreter's own work between calls.

Three stretches per batched step (:func:`batch_split`), for the receiving relay:

- ``arrival``: the sender's write of the batch ends (the bytes are in the receiver's socket:
  loopback delivers inside the write) → the receiver's next read of that socket ends. A
  receiver asleep on another, idle CPU is woken only after the write has returned (the wake-up
  is queued to that CPU, which takes it when it leaves its idle state: ``asleep`` here); one
  that was busy finishes its other work first (``user`` and calls here).
- ``first``: that read → the batch's first write (position 0).
- ``next``: a write of the batch → the next one in the same loop turn (position k ≥ 1): what a
  place in a batch costs.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

_SWITCH = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)")
_WAKEUP = re.compile(r" pid=(\d+) ")


@dataclass(frozen=True)
class Switch:
    t: float  # s, perf's clock
    prev: int  # tid switched out
    state: str  # its prev_state: R (R+) = still runnable, preempted
    next: int  # tid switched in (0: idle)
    cpu: int = -1


def parse_sched(text: str) -> tuple[list[Switch], dict[int, list[float]]]:
    """``perf script -F tid,cpu,time,event,trace`` (the CPU may be left out) of sched_switch
    and sched_wakeup: the switches in order, and each woken tid's wake-up times in order."""
    switches: list[Switch] = []
    wakeups: dict[int, list[float]] = {}
    for line in text.splitlines():
        fields = line.split(None, 4)
        cpu = -1
        if len(fields) > 1 and fields[1].startswith("["):
            cpu = int(fields[1].strip("[]"))
        else:
            fields = line.split(None, 3)
        if len(fields) < 4 or not fields[-3].endswith(":"):
            continue
        t = float(fields[-3][:-1])
        if fields[-2] == "sched:sched_switch:" and (m := _SWITCH.search(fields[-1])):
            switches.append(Switch(t, int(m[1]), m[2], int(m[3]), cpu))
        elif fields[-2] == "sched:sched_wakeup:" and (m := _WAKEUP.search(f" {fields[-1]} ")):
            wakeups.setdefault(int(m[1]), []).append(t)
    switches.sort(key=lambda s: s.t)
    for ts in wakeups.values():
        ts.sort()
    return switches, wakeups


@dataclass(frozen=True)
class Off:
    """One stretch a thread spent off its CPU."""

    out: float  # switched out
    back: float  # switched back in
    woken: float  # made runnable again (== out when preempted)
    preempted: bool
    by: int  # the tid that took the CPU when it went out
    yielder: int = 0  # the tid that gave the CPU back to it


def offs(switches: Sequence[Switch], wakeups: dict[int, list[float]], tid: int) -> list[Off]:
    """Thread ``tid``'s stretches off CPU, in order (one open at the trace's start or end is
    left out). A sleep whose wake-up the trace lost counts as asleep to the end."""
    out: list[Off] = []
    gone: Switch | None = None
    woken = wakeups.get(tid, [])
    for s in switches:
        if s.prev == tid:
            gone = s
        elif s.next == tid and gone is not None:
            preempted = gone.state.startswith("R")
            wake = gone.t
            if not preempted:
                i = bisect.bisect_left(woken, gone.t)
                wake = woken[i] if i < len(woken) and woken[i] <= s.t else s.t
            out.append(Off(gone.t, s.t, wake, preempted, gone.next, s.prev))
            gone = None
    return out


class _Call(Protocol):  # hops.Call
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...


C = TypeVar("C", bound=_Call)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class Timeline(Generic[C]):
    """One thread's off-CPU stretches and syscalls, to cut any stretch of its time with."""

    def __init__(self, off: list[Off], calls: Sequence[C], kind: Callable[[C], str]) -> None:
        self.off = off
        self.outs = [o.out for o in off]
        self.calls = calls
        self.ends = [c.end for c in calls]
        self.kind = kind

    def _offs(self, a: float, b: float) -> list[Off]:
        i = max(0, bisect.bisect_left(self.outs, a) - 1)
        j = bisect.bisect_right(self.outs, b)
        return [o for o in self.off[i:j] if o.back > a and o.out < b]

    def _off_in(self, a: float, b: float, offs: list[Off]) -> float:
        return sum(_overlap(a, b, o.out, o.back) for o in offs)

    def state_at(self, t: float) -> str:
        """``on_cpu``, ``preempted``, ``asleep`` (not yet woken) or ``woken_waiting`` at
        ``t``."""
        for o in self._offs(t, t):
            if o.out <= t < o.back:
                if o.preempted:
                    return "preempted"
                return "asleep" if t < o.woken else "woken_waiting"
        return "on_cpu"

    def split(self, a: float, b: float) -> dict[str, float]:
        """Seconds of [a, b]: off CPU (asleep, woken_waiting, preempted), on CPU in syscalls
        (``sys:KIND``), and ``user``, the rest; they add up to b - a."""
        offs = self._offs(a, b)
        out: defaultdict[str, float] = defaultdict(float)
        for o in offs:
            if o.preempted:
                out["preempted"] += _overlap(a, b, o.out, o.back)
            else:
                out["asleep"] += _overlap(a, b, o.out, o.woken)
                out["woken_waiting"] += _overlap(a, b, o.woken, o.back)
        on = (b - a) - sum(out.values())
        i = bisect.bisect_right(self.ends, a)
        for c in self.calls[i:]:
            if c.start >= b:
                break
            lo, hi = max(a, c.start), min(b, c.end)
            if hi > lo:
                cpu = (hi - lo) - self._off_in(lo, hi, offs)
                out[f"sys:{self.kind(c)}"] += cpu
                on -= cpu
        out["user"] = on
        return dict(out)

    def calls_in(self, a: float, b: float) -> Counter[str]:
        """The syscalls that ended in (a, b), by kind."""
        i, j = bisect.bisect_right(self.ends, a), bisect.bisect_left(self.ends, b)
        return Counter(self.kind(c) for c in self.calls[i:j])

    def preemptors(self, a: float, b: float) -> list[int]:
        return [o.by for o in self._offs(a, b) if o.preempted]

    def waited_for(self, a: float, b: float) -> list[int]:
        """Who ran on the CPU until this thread got it back, for each wait that ended in
        (a, b] after a wake-up."""
        return [o.yielder for o in self._offs(a, b) if not o.preempted and o.back > o.woken]


def placement(switches: Sequence[Switch], tids: dict[int, str]) -> dict[str, dict[str, float]]:
    """What ran where: for each name of ``tids`` (tid → name; tid 0, the idle task, is
    ``idle``, any other ``other``), the share of the traced time (first switch to last) its
    threads spent on each CPU, from a switch in on that CPU to the switch out."""
    since: dict[tuple[int, int], float] = {}  # (cpu, tid) → switched in
    on: dict[str, defaultdict[int, float]] = {}
    for s in switches:
        if (s.cpu, s.prev) in since:
            name = "idle" if s.prev == 0 else tids.get(s.prev, "other")
            on.setdefault(name, defaultdict(float))[s.cpu] += s.t - since.pop((s.cpu, s.prev))
        since[(s.cpu, s.next)] = s.t
    span = switches[-1].t - switches[0].t if switches else 0.0
    return {
        name: {f"cpu{cpu}": round(t / span, 3) for cpu, t in sorted(by.items())}
        for name, by in sorted(on.items())
        if span > 0
    }


def summary(
    cuts: list[dict[str, float]],
    calls: list[Counter[str]],
    preemptors: Counter[str],
    waited: Counter[str],
) -> dict[str, Any]:
    """Stretches' length (p50, mean), each part's mean (µs) and the share of stretches that
    have it, who preempted, the calls that ended inside the stretches (per stretch)."""
    n = len(cuts)
    if not n:
        return {"n": 0}
    lengths = sorted(sum(c.values()) for c in cuts)
    parts: defaultdict[str, float] = defaultdict(float)
    for c in cuts:
        for k, v in c.items():
            parts[k] += v
    count: Counter[str] = Counter()
    for made in calls:
        count.update(made)
    return {
        "n": n,
        "p50_us": round(lengths[n // 2] * 1e6, 1),
        "mean_us": round(sum(lengths) / n * 1e6, 1),
        "parts_mean_us": {k: round(v / n * 1e6, 1) for k, v in sorted(parts.items())},
        "parts_share": {
            k: round(sum(1 for c in cuts if c.get(k, 0) > 0) / n, 3) for k in sorted(parts)
        },
        "preempted_by": dict(preemptors.most_common()),
        "woken_waited_for": dict(waited.most_common()),
        "calls_per_stretch": {k: round(v / n, 2) for k, v in sorted(count.items())},
    }


def batch_split(
    line: Timeline[Any],
    batch: Sequence[tuple[float, float, int, int]],
    inbound: dict[int, list[float]],
    role: Callable[[int], str],
) -> dict[str, Any]:
    """``batch``: each request's (sender's write end, receiver's batch write end, position,
    the receiver's socket it came in on); ``inbound``: by socket, the ends of the receiver's
    reads of it (of data). The stretches ``arrival`` and ``first`` (position 0) and ``next``
    (position ≥ 1; it starts at the previous write of the batch, ``line.kind`` "batch w"),
    each :func:`summary`-ed; for ``arrival`` the receiver's state (:meth:`Timeline.state_at`)
    when the send ended; ``first_by_batch_size``: the ``first`` stretch's mean length and
    ``user`` by how many writes its batch made (the position-0 write and the later ones up to
    the next position 0, in time order; 4 and more together): whether the first write waits
    for the rest of the batch's frames or only for its own; ``first_by_gap``: the same by how
    long before the stretch the receiver's last batch write ended (its answer path last ran;
    :data:`GAPS`): what a path that has cooled meanwhile (other processes on its CPU) costs."""
    acc: dict[str, tuple[list[dict[str, float]], list[Counter[str]], Counter[str], Counter[str]]]
    acc = {k: ([], [], Counter(), Counter()) for k in ("arrival", "first", "next")}
    found: Counter[str] = Counter()
    size: dict[tuple[float, float, int, int], int] = {}
    head = None
    for item in sorted(batch, key=lambda x: x[1]):
        if item[2] == 0:
            head, size[item] = item, 1
        elif head is not None:
            size[head] += 1
    by_size: dict[str, list[dict[str, float]]] = {}
    by_gap: dict[str, list[dict[str, float]]] = {}
    writes = [c.end for c in line.calls if line.kind(c) == "batch w"]

    def add(name: str, a: float, b: float) -> None:
        cuts, calls, who, waited = acc[name]
        cuts.append(line.split(a, b))
        calls.append(line.calls_in(a, b))
        who.update(role(t) for t in line.preemptors(a, b))
        waited.update(role(t) for t in line.waited_for(a, b))

    for sent, wrote, pos, fd in batch:
        if pos == 0:
            reads = inbound.get(fd, [])
            i = bisect.bisect_left(reads, sent)
            if i == len(reads) or reads[i] > wrote:
                continue  # no read of it between the send and the write: not followed
            found[line.state_at(sent)] += 1
            add("arrival", sent, reads[i])
            add("first", reads[i], wrote)
            cut = acc["first"][0][-1]
            by_size.setdefault(_size(size[(sent, wrote, pos, fd)]), []).append(cut)
            j = bisect.bisect_left(writes, reads[i]) - 1
            if j >= 0:
                by_gap.setdefault(_gap(reads[i] - writes[j]), []).append(cut)
        else:
            k = bisect.bisect_left(line.ends, wrote) - 1
            while k >= 0 and line.kind(line.calls[k]) != "batch w":
                k -= 1
            if k >= 0:
                add("next", line.calls[k].end, wrote)
    out = {name: summary(*acc[name]) for name in acc}
    if n := sum(found.values()):
        out["arrival"]["receiver_at_send"] = {k: round(v / n, 3) for k, v in found.most_common()}
    out["first_by_batch_size"] = {k: _means(by_size[k]) for k in sorted(by_size)}
    out["first_by_gap"] = {k: _means(by_gap[k]) for k in [*GAPS.values(), GAP_LAST] if k in by_gap}
    return out


def _means(cuts: list[dict[str, float]]) -> dict[str, float]:
    return {
        "n": len(cuts),
        "mean_us": round(sum(sum(c.values()) for c in cuts) / len(cuts) * 1e6, 1),
        "user_us": round(sum(c.get("user", 0.0) for c in cuts) / len(cuts) * 1e6, 1),
    }


def _size(n: int) -> str:
    return f"{n}" if n < 4 else "4+"


# first_by_gap's buckets: upper bound (s) → name, and the rest.
GAPS = {150e-6: "<150us", 400e-6: "150-400us", 1e-3: "400-1000us"}
GAP_LAST = ">=1000us"


def _gap(gap: float) -> str:
    return next((name for bound, name in GAPS.items() if gap < bound), GAP_LAST)
