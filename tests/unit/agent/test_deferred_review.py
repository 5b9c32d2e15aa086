"""review35: agentmem4's deferred stdlib modules tried where they are first needed (tests only).

Each probe below runs in a fresh child process twice: with the agent's deferrals applied first
(``defer_unused()``, as ``ravenproxy.__main__.prepare`` does for ``ravenproxy agent``) and
without. It is the first use of one or more deferred modules (an exception logged with its
traceback, a warning, asyncio's debug mode and its never-retrieved task, ``traceback``'s own
functions, subprocess's text mode, ``socket.sendfile``, asyncio's own event loop, copies and
pickles of the agent's objects, ``inspect``, ``faulthandler``, ``sys.excepthook``); both runs
must print the same thing, and each deferred module used must then be whole: a plain module
with the same names, the stand-ins replaced by the module's own functions, a submodule its
package's attribute.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.agent.deferred import STAND_INS, UNUSED

ROOT = Path(__file__).resolve().parents[3]
DEFERRED = sorted({*UNUSED, *STAND_INS})

PROBES = r'''
import sys
mode, probe = sys.argv[1], sys.argv[2]
if mode == "deferred":
    from ravenproxy.agent.deferred import defer_unused
    defer_unused()
import asyncio, io, json, logging, os, socket, warnings
if mode == "deferred":
    defer_unused()  # again, as ravenproxy.cli.main does: submodules attached to their package

from ravenproxy.log import KeyValueFormatter

def inner():
    raise ValueError("inner failure")

def outer():
    try:
        inner()
    except ValueError as exc:
        raise RuntimeError("outer failure") from exc

def logged(level=logging.DEBUG):
    """A logger writing through the agent's formatter into a buffer."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(KeyValueFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return buf

def steady(text, ordered=True):
    """A debug-mode log without what the machine's load decides: which calls were slow
    (logged as such, a getaddrinfo's at INFO then), and, unless ``ordered``, the order of
    events of two file descriptors (a child's exit and its pipe's end). Whether a slow call
    was reported is kept."""
    lines = [line for line in text.splitlines() if " took " not in line]
    return ["\n".join(lines if ordered else sorted(lines)), " took " in text]

def log_exception():
    buf = logged()
    try:
        outer()
    except RuntimeError:
        logging.getLogger("ravenproxy.agent").exception("stream handler failed")
    try:
        outer()
    except RuntimeError:
        logging.getLogger("ravenproxy.agent").error("x", exc_info=True, stack_info=True)
    return buf.getvalue()

def warn():
    buf = io.StringIO()
    sys.stderr = buf
    warnings.simplefilter("always")
    warnings.warn("careful", DeprecationWarning)
    warnings.warn_explicit("explicit", UserWarning, "explicit.py", 3)
    logging.captureWarnings(True)
    logged_buf = logged()
    warnings.warn("captured", RuntimeWarning)
    sys.stderr = sys.__stderr__
    return [buf.getvalue(), logged_buf.getvalue()]

def traceback_functions():
    import traceback
    out = io.StringIO()
    try:
        outer()
    except RuntimeError:
        traceback.print_exc(file=out)
        formatted = traceback.format_exc()
        te = traceback.TracebackException(*sys.exc_info())
    here = sys._getframe()
    return [
        out.getvalue(), formatted, list(te.format()),
        traceback.format_list(traceback.extract_stack()),
        [f.f_code.co_name for f, _ in traceback.walk_stack(None)],
        [f.f_code.co_name for f, _ in traceback.walk_stack(here)],
        traceback.format_stack(limit=2),
        repr(traceback.StackSummary.extract(traceback.walk_stack(here))),
        traceback.extract_stack.__module__, traceback.walk_stack.__module__,
        traceback.StackSummary.__module__,
    ]

def task_never_retrieved():
    import gc, uvloop
    buf = logged()
    async def fails():
        outer()
    async def main():
        asyncio.get_running_loop().create_task(fails())
        await asyncio.sleep(0.01)
        gc.collect()
        await asyncio.sleep(0)
    uvloop.run(main())
    gc.collect()
    return buf.getvalue()

def asyncio_debug():
    import gc, time, uvloop
    buf = logged()
    async def fails():
        outer()
    async def main():
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = 0.05
        loop.call_soon(time.sleep, 0.1)
        loop.create_task(fails())
        future = loop.create_future()
        await asyncio.sleep(0.2)
        gc.collect()
        await asyncio.sleep(0)
        return [f.name for f in future._source_traceback][-1:]
    names = uvloop.run(main(), debug=True)
    gc.collect()
    return [names, *steady(buf.getvalue())]

def asyncio_own_loop():
    buf = logged()
    async def main():
        loop = asyncio.get_running_loop()
        server = await asyncio.start_server(
            lambda r, w: (w.write(b"hi"), w.close()), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "localhost", port, happy_eyeballs_delay=0.05, family=socket.AF_INET)
        kind = type(writer.get_extra_info("socket")).__name__
        got = await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "print(42)", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        return [type(loop).__name__, kind, got.decode(), out.decode()]
    return [asyncio.run(main(), debug=True), *steady(buf.getvalue(), ordered=False)]

def sendfile():
    a, b = socket.socketpair()
    path = os.path.join(sys.argv[3], "data")
    with open(path, "wb") as f:
        f.write(b"x" * 70000)
    with open(path, "rb") as f:
        a.settimeout(5)
        sent = a.sendfile(f, 0, 5000)
    return [sent, len(b.recv(10000))]

def subprocess_text():
    import subprocess
    done = subprocess.run(
        [sys.executable, "-c", "print('caf\\u00e9')"], capture_output=True, text=True)
    try:
        subprocess.check_output([sys.executable, "-c", "raise SystemExit(3)"], text=True)
    except subprocess.CalledProcessError as exc:
        error = str(exc)
    return [done.stdout, error, subprocess.list2cmdline(["a b", "c"])]

def children():
    from ravenproxy import children
    async def main():
        try:
            await children.run_module("ravenproxy.no_such_module", b"", timeout=20)
        except Exception as exc:
            return [type(exc).__name__, str(exc).split(":")[0]]
    import uvloop
    return uvloop.run(main())

def copies():
    import copy, dataclasses, pickle
    from pathlib import Path
    from ravenproxy.agent.settings import AgentSettings
    from ravenproxy.wire.events import SettingsReceived
    paths = {k: Path("/x") / k for k in ("ca_file", "cert_file", "key_file")}
    settings = AgentSettings(node_name="edge-1", **paths)
    event = SettingsReceived({"window": 1}, "s1")
    out = []
    for obj in (settings, event):
        again = dataclasses.replace(obj)
        out += [
            repr(again), repr(copy.copy(obj)), copy.deepcopy(obj) == obj,
            repr(dataclasses.asdict(obj)), repr(dataclasses.astuple(obj)),
            pickle.loads(pickle.dumps(obj)) == obj,
        ]
    return out

def inspect_use():
    import inspect
    return [str(inspect.signature(outer)), inspect.getsource(inner), inspect.isclass(int)]

def faulthandler_dump():
    import faulthandler, tempfile
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=False)
        f.seek(0)
        return f.read()

def excepthook():
    sys.stderr = buf = io.StringIO()
    try:
        outer()
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    import threading
    t = threading.Thread(target=outer)
    t.start()
    t.join()
    sys.stderr = sys.__stderr__
    return buf.getvalue()

def threads():
    """Eight threads reading deferred modules at once (an executor's thread logging, say): each
    gets the whole module, and the logs are those without deferrals."""
    import threading
    barrier, out = threading.Barrier(8), []
    buf = logged()
    def use(i):
        barrier.wait()
        try:
            outer()
        except RuntimeError:
            logging.getLogger("t").exception("thread failed")
            import traceback, copy, subprocess
            out.append([traceback.format_exc().count("\n"), copy.deepcopy([i]), subprocess.PIPE])
    ts = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return [sorted(out), sorted(buf.getvalue().splitlines())]

result = globals()[probe]()
state = {}
for name in json.loads(sys.argv[4]):
    module = sys.modules.get(name)
    if module is not None and type(module).__name__ != "LazyModule":
        parent, _, child = name.rpartition(".")
        attached = not parent or getattr(sys.modules[parent], child, None) is module
        state[name] = [type(module).__name__, sorted(vars(module)), attached]
        state[name].append(sorted(
            k for k, v in vars(module).items()
            if getattr(v, "__module__", name) == "ravenproxy.agent.deferred"))
print(json.dumps({"result": result, "modules": state}))
'''

PROBE_NAMES = [
    "log_exception",
    "warn",
    "traceback_functions",
    "task_never_retrieved",
    "asyncio_debug",
    "asyncio_own_loop",
    "sendfile",
    "subprocess_text",
    "children",
    "copies",
    "inspect_use",
    "faulthandler_dump",
    "excepthook",
    "threads",
]


def normal(text: str) -> str:
    """Addresses and durations vary from run to run."""
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = re.sub(r"took \d+\.\d+ ?(seconds|ms)", "took ?", text)
    text = re.sub(r"((?:127\.0\.0\.1|localhost)'?[:,] ?)\d+|fd=\d+", r"\1?", text)
    text = re.sub(r"\d{4}-\d\d-\d\d [\d:,]+ |retry_in=\S+", "", text)
    text = re.sub(r"(?i)(pid=?|process) ?\d+", r"\1 ?", text)
    # A child's pipe, closing or closed as its exit is seen (asyncio's own loop, debug mode).
    text = re.sub(r"<_UnixReadPipeTransport [^>]*>", "<pipe>", text)
    return re.sub(r"Thread-\d+|\(\d+\)|Thread 0x\?", "Thread", text)


def probe(mode: str, name: str, tmp_path: Path) -> dict[str, Any]:
    # A file, not ``-c``: tracebacks and warnings then show their source lines (linecache).
    script = tmp_path / "probe_script.py"
    script.write_text(PROBES)
    done = subprocess.run(
        [sys.executable, str(script), mode, name, str(tmp_path), json.dumps(DEFERRED)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert not done.stderr, done.stderr.decode()[-3000:]
    result: dict[str, Any] = json.loads(normal(done.stdout.decode()))
    return result


@pytest.mark.parametrize("name", PROBE_NAMES)
def test_a_deferred_modules_first_use_answers_as_the_module_loaded_at_import(
    name: str, tmp_path: Path
) -> None:
    deferred, plain = probe("deferred", name, tmp_path), probe("plain", name, tmp_path)
    assert deferred["result"] == plain["result"]
    # Every module the probe used is whole: a plain module, the same names, nothing of the
    # stand-ins left, a submodule its package's attribute.
    for module, (kind, names, attached, stand_ins) in deferred["modules"].items():
        assert kind == "module", module
        assert names == plain["modules"][module][1], module
        assert attached and not stand_ins, (module, attached, stand_ins)


def test_the_probes_use_what_they_are_about(tmp_path: Path) -> None:
    """Sanity: the logged traceback carries source lines (linecache ran), and the debug-mode
    and never-retrieved logs are there, in the deferred run."""
    logged = probe("deferred", "log_exception", tmp_path)
    assert 'raise ValueError("inner failure")' in logged["result"]
    assert {"traceback", "linecache", "tokenize"} <= set(logged["modules"])
    debug = probe("deferred", "asyncio_debug", tmp_path)["result"]
    assert debug[0] == ["main"] and debug[2] is True
    assert "Task exception was never retrieved" in debug[1] and "outer failure" in debug[1]
    own = probe("deferred", "asyncio_own_loop", tmp_path)
    assert own["result"][0][:2] == ["_UnixSelectorEventLoop", "TransportSocket"]
    assert {"selectors", "asyncio.trsock", "asyncio.staggered"} <= set(own["modules"])
    text = probe("deferred", "subprocess_text", tmp_path)
    assert text["result"][0] == "caf\u00e9\n" and "locale" in text["modules"]


# -- a real agent, started through the CLI ---------------------------------------------------
# ``AGENT MODE CASE ARGV...``: the agent's own entry (its deferrals) or, ``plain``, the same with
# ``defer_unused`` a no-op. ``probe``: once the agent has logged its first failed dial, from
# inside its event loop, an exception logged, a warning, a task whose exception is never
# retrieved, then SIGTERM. ``crash`` / ``typed``: the agent's run raises an untyped / a typed
# error.
AGENT = r"""
import sys
mode, case, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if mode == "plain":
    import ravenproxy.agent.deferred
    ravenproxy.agent.deferred.defer_unused = lambda: None
else:
    import ravenproxy.__main__ as entry
    entry.prepare(argv)
import asyncio, gc, logging, os, signal, warnings
from ravenproxy import cli

def inner():
    raise ValueError("inner failure")

async def fails():
    inner()

class Probe(logging.Handler):
    done = False

    def emit(self, record):
        if self.done or record.getMessage() != "cannot reach the server, retrying":
            return
        self.done = True
        log = logging.getLogger("ravenproxy.agent.probe")
        log.warning("probe start")
        try:
            inner()
        except ValueError:
            log.exception("stream handler failed")
        warnings.warn("careful", RuntimeWarning)
        asyncio.get_running_loop().create_task(fails())
        asyncio.get_running_loop().call_later(0.2, self.end)

    def end(self):
        gc.collect()
        logging.getLogger("ravenproxy.agent.probe").warning("probe end")
        os.kill(os.getpid(), signal.SIGTERM)

if case == "probe":
    logging.getLogger("ravenproxy.agent").addHandler(Probe())
    logging.captureWarnings(True)
else:
    from ravenproxy.agent import app
    from ravenproxy.errors import ConfigError

    async def run(self):
        if case == "typed":
            raise ConfigError("--allow", "refused by the probe")
        inner()

    app.Agent.run = run
sys.exit(cli.main(argv))
"""


def run_agent(tmp_path: Path, mode: str, case: str, *python_flags: str) -> tuple[int, str]:
    from ravenproxy.pki import init_pki

    certs = tmp_path / "certs"
    if not certs.exists():
        init_pki(certs, ("localhost",), ("edge-1",))
    script = tmp_path / "agent_probe.py"
    script.write_text(AGENT)
    args = [
        "agent", "--node-name", "edge-1", "--server-addr", "wss://127.0.0.1:1",
        "--ca-file", str(certs / "ca.crt"), "--cert-file", str(certs / "edge-1.crt"),
        "--key-file", str(certs / "edge-1.key"), "--allow", "127.0.0.1:1",
        "--log-level", "debug",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "-X" in python_flags:
        env["PYTHONASYNCIODEBUG"] = "1"
    done = subprocess.run(
        [sys.executable, *python_flags, str(script), mode, case, *args],
        cwd=ROOT, env=env, capture_output=True, timeout=60,
    )  # fmt: skip
    return done.returncode, done.stderr.decode()


def probe_block(text: str) -> str:
    """The agent's log from the probe's first line to its last: the probe's, asyncio's and the
    warnings' lines (with their tracebacks), without the agent's own dial lines, times, and the
    slow callbacks debug mode reports (they depend on the machine's load)."""
    start, end = text.index("probe start"), text.index("probe end")
    lines = normal(text[text.rindex("\n", 0, start) + 1 : end]).splitlines()
    ours = ("ravenproxy.agent.probe: ", "asyncio: ", "py.warnings: ")
    kept = [
        line
        for line in lines
        if " took " not in line
        and not line.startswith("import time:")  # -X importtime: a deferred module's own
        and (not re.match(r"(DEBUG|INFO|WARNING|ERROR) ", line) or any(n in line for n in ours))
    ]
    return "\n".join(kept)


@pytest.mark.parametrize(
    "python_flags",
    [(), ("-X", "dev"), ("-X", "importtime")],
    ids=["plain", "dev-mode", "importtime"],
)
def test_an_agents_logged_exception_warning_and_lost_task_as_without_deferrals(
    tmp_path: Path, python_flags: tuple[str, ...]
) -> None:
    (code, text), (plain_code, plain_text) = (
        run_agent(tmp_path, mode, "probe", *python_flags) for mode in ("deferred", "plain")
    )
    assert code == plain_code == 0, text[-3000:]
    block = probe_block(text)
    assert block == probe_block(plain_text)
    assert 'raise ValueError("inner failure")' in block  # source lines: linecache ran
    assert "Task exception was never retrieved" in block and "RuntimeWarning" in block
    assert "LazyModule" not in text and "partially initialized" not in text
    if "importtime" in python_flags:
        # The agent's imports are timed; a deferred module's code, run at its first use by
        # ravenproxy.lazymodule.load, is not (no "| traceback" line: it is no import).
        assert re.search(r"import time:.*\| +ravenproxy\.agent\.app$", text, re.M)


@pytest.mark.parametrize("case", ["crash", "typed"])
def test_an_agent_that_fails_says_what_it_said_without_deferrals(tmp_path: Path, case: str) -> None:
    (code, text), (plain_code, plain_text) = (
        run_agent(tmp_path, mode, case) for mode in ("deferred", "plain")
    )
    assert code == plain_code and normal(text) == normal(plain_text)
    if case == "typed":
        assert code == 2 and text.splitlines()[-1] == (
            "ravenproxy agent: error: --allow: refused by the probe"
        )
        assert "Traceback" not in text
    else:
        # An untyped error is not ours to word: the interpreter's traceback, with its lines.
        assert code == 1 and 'raise ValueError("inner failure")' in text
