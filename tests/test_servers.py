"""hmmscope.ui.servers with real processes and real sockets: free ports, health checks, children that die with their
parent, whole process groups stopped, and `supervise` (clean stop on SIGTERM, a server that exits before or after
it answers). Every process a test starts is stopped by its pid, and checked gone. The full `hmmscope ui` with a
real MLflow server is tests/test_ui.py."""

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hmmscope import tracking
from hmmscope.ui import servers

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid):
    """(state, start time) of a process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]


def _running(pid, start):
    """The process `pid` started at `start` still runs (not gone, not a zombie, not a reused pid)."""
    st = _stat(pid)
    return st is not None and st[1] == start and st[0] != "Z"


def _wait_gone(pid, start, timeout=20.0):
    deadline = time.time() + timeout
    while _running(pid, start):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill(pid, start):
    """Stop a process this test started, by its pid (only if it is still that process)."""
    if _running(pid, start):
        os.kill(pid, signal.SIGKILL)


def _children(pid):
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _read_line(proc, timeout=30.0):
    """The next line of proc's stdout, without blocking past `timeout`."""
    box = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert box, f"no line within {timeout} s (exit code {proc.poll()})"
    return box[0].strip()


def test_a_port_a_stopped_server_left_in_time_wait_is_free():
    """Issue 36, item 9: `ui --port P` was refused for a minute after a ui on P stopped (its connections in
    TIME_WAIT: the probe bound without SO_REUSEADDR, which every server sets)."""
    import socket

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server closes first: its end of the connection waits in TIME_WAIT on `port`
    cli.recv(1)
    cli.close()
    srv.close()
    with socket.socket() as plain:  # what the old probe did
        try:
            plain.bind(("127.0.0.1", port))
            in_time_wait = False
        except OSError:
            in_time_wait = True
    assert in_time_wait, "no TIME_WAIT connection was left: the test shows nothing"
    assert servers.port_free(port)


def test_port_free_sees_a_bound_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not servers.port_free(port)
    assert servers.port_free(port)


def test_answers_needs_200_only_when_asked():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        assert servers.answers(url + "/health") and servers.answers(url + "/health", ok_only=False)
        assert not servers.answers(url + "/nope") and servers.answers(url + "/nope", ok_only=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join()
    assert not servers.answers(url + "/health", ok_only=False)  # nothing listens any more


@linux
def test_a_child_dies_with_its_parent_even_by_sigkill(tmp_path):
    code = ("import subprocess, sys, time\n"
            "from hmmscope.interrupts import die_with_parent\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], preexec_fn=die_with_parent())\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child, child_start = None, None
    try:
        child = int(_read_line(parent))
        child_start = _stat(child)[1]
        assert _running(child, child_start)
        parent.send_signal(signal.SIGKILL)
        assert parent.wait(timeout=30) == -signal.SIGKILL
        assert _wait_gone(child, child_start), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        if child is not None:
            _kill(child, child_start)


@linux
def test_stop_groups_terms_every_member_then_returns(tmp_path):
    """SIGTERM reaches the whole group: the leader's child (not signalled by the leader) writes its marker on
    SIGTERM; the leader waits for it before exiting. Both are gone, well before the grace period ends."""
    marker = tmp_path / "child-got-sigterm"
    child_code = ("import signal, sys, time\n"
                  f"def bye(*a): open({str(marker)!r}, 'w').close(); sys.exit(0)\n"
                  "signal.signal(signal.SIGTERM, bye)\n"
                  "print('ready', flush=True)\n"
                  "time.sleep(120)\n")
    leader_code = ("import signal, subprocess, sys, time\n"
                   f"c = subprocess.Popen([sys.executable, '-c', {child_code!r}], stdout=subprocess.PIPE, text=True)\n"
                   "c.stdout.readline()\n"
                   "signal.signal(signal.SIGTERM, lambda *a: (c.wait(), sys.exit(0)))\n"
                   "print(c.pid, flush=True)\n"
                   "time.sleep(120)\n")
    leader = subprocess.Popen([sys.executable, "-c", leader_code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child, child_start = None, None
    try:
        child = int(_read_line(leader))
        child_start = _stat(child)[1]
        t0 = time.monotonic()
        servers.stop_groups([leader], grace=30)
        assert time.monotonic() - t0 < 20
        assert leader.returncode == 0 and marker.exists() and not _running(child, child_start)
    finally:
        if leader.poll() is None:
            leader.kill()
        leader.wait()
        if child is not None:
            _kill(child, child_start)


@linux
def test_stop_groups_kills_what_ignores_sigterm_after_the_grace_period():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _read_line(p) == "ready"
        t0 = time.monotonic()
        servers.stop_groups([p], grace=1.0)
        assert time.monotonic() - t0 >= 1.0 and p.returncode == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


SUPERVISOR = """
import json, sys
from hmmscope.ui import servers
name, url, path, argv = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
s = servers.Server(name, tuple(argv), url, path, needs_200=False)
f = servers.supervise([s], servers.server_env(), ready=lambda: print("ready", flush=True))
print(json.dumps(None if f is None else [f.message, f.log_path, list(f.tail)]), flush=True)
"""


def _supervisor(tmp_path, argv, port):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-c", SUPERVISOR, "web", f"http://127.0.0.1:{port}", "/", json.dumps(argv)],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)


def _web(port):
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


@linux
def test_supervise_stops_its_server_on_sigterm_and_removes_the_log(tmp_path):
    port = _free_port()
    sup = _supervisor(tmp_path, _web(port), port)
    kids = {}
    try:
        assert _read_line(sup) == "ready"
        assert servers.answers(f"http://127.0.0.1:{port}/", ok_only=False)
        kids = {pid: _stat(pid)[1] for pid in _children(sup.pid)}
        assert len(kids) == 1 and len(list(tmp_path.glob("hmmscope-ui-*.log"))) == 1
        sup.send_signal(signal.SIGTERM)
        assert _read_line(sup) == "null" and sup.wait(timeout=30) == 0
        assert not any(_running(pid, start) for pid, start in kids.items())
        assert not servers.answers(f"http://127.0.0.1:{port}/", ok_only=False)
        assert list(tmp_path.glob("hmmscope-ui-*.log")) == []
    finally:
        if sup.poll() is None:
            sup.kill()
        sup.wait()
        for pid, start in kids.items():
            _kill(pid, start)


SWALLOWING = """
import json, os, signal, sys, time
from hmmscope.ui import servers
url, argv = sys.argv[1], json.loads(sys.argv[2])


class Swallows:  # Ctrl-C while Python runs a __del__: its KeyboardInterrupt is printed and dropped
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)


def ready():
    x = Swallows()
    del x  # the interrupt is lost here; supervise must still stop
    print("ready", flush=True)


f = servers.supervise([servers.Server("web", tuple(argv), url, "/", needs_200=False)], servers.server_env(), ready=ready)
print(json.dumps(None if f is None else f.message), flush=True)
"""


@linux
def test_supervise_stops_on_a_ctrl_c_whose_interrupt_python_swallowed(tmp_path):
    """Before: Ctrl-C arriving while Python ran a __del__ (or a weakref callback) was dropped with "Exception ignored",
    and `hmmscope ui` kept serving (a test's `ui` did not exit within 60 s of its Ctrl-C under load)."""
    port = _free_port()
    sup = subprocess.Popen([sys.executable, "-c", SWALLOWING, f"http://127.0.0.1:{port}", json.dumps(_web(port))],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": str(tmp_path)}, start_new_session=True)
    try:
        out, err = sup.communicate(timeout=120)
        assert sup.returncode == 0 and out.splitlines() == ["ready", "null"], (out, err)
        assert "KeyboardInterrupt" in err  # Python did swallow it (the case under test)
        assert not servers.answers(f"http://127.0.0.1:{port}/", ok_only=False)
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()


@linux
def test_supervise_reports_a_server_that_exits_before_it_answers(tmp_path):
    port = _free_port()
    sup = _supervisor(tmp_path, [sys.executable, "-c", "print('boom', flush=True); raise SystemExit(3)"], port)
    try:
        message, log_path, tail = json.loads(_read_line(sup))
        assert sup.wait(timeout=30) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
        sup.wait()
    assert message == "web exited with code 3 before it answered" and tail == ["boom"]
    assert Path(log_path).parent == tmp_path and Path(log_path).exists()  # kept, for the user to read


@linux
def test_supervise_reports_a_server_that_dies_after_it_answered(tmp_path):
    port = _free_port()
    sup = _supervisor(tmp_path, _web(port), port)
    kids = {}
    try:
        assert _read_line(sup) == "ready"
        kids = {pid: _stat(pid)[1] for pid in _children(sup.pid)}
        assert len(kids) == 1
        os.kill(next(iter(kids)), signal.SIGKILL)
        message, log_path, tail = json.loads(_read_line(sup))
        assert sup.wait(timeout=30) == 0
        assert message == f"web exited with code {-signal.SIGKILL}" and Path(log_path).exists()
    finally:
        if sup.poll() is None:
            sup.kill()
        sup.wait()
        for pid, start in kids.items():
            _kill(pid, start)


def test_server_command_lines(tmp_path, store_uri):
    """The MLflow UI's argv: a list of typed values, each joined to its option with '=', the executable
    resolved, one quiet uvicorn worker; optuna-dashboard's: this Python running the guard, 127.0.0.1, the port, then
    the storage after `--` (a storage starting with '-' stays the positional argument)."""
    uri = store_uri
    ui = servers.mlflow_ui(uri, 5001)
    root = tracking.artifact_root(uri)
    served = tracking.server_uri(uri)  # opened, never created (issue 47: the server re-created a moved store)
    assert served.startswith("sqlite+pysqlite:///file:/") and served.endswith("?mode=rw&uri=true")
    assert Path(ui.argv[0]).name == "mlflow" and ui.argv[1:] == (
        "ui", f"--backend-store-uri={served}", f"--registry-store-uri={served}",
        *((f"--default-artifact-root={root}",) if root else ()), "--host=127.0.0.1", "--port=5001", "--workers=1",
        "--uvicorn-opts=--log-level warning --no-access-log")
    assert (ui.name, ui.url, ui.path, ui.needs_200) == ("MLflow UI", "http://127.0.0.1:5001", "/health", True)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    dash = servers.optuna_dashboard(storage, 8081)
    assert dash.argv[0] == sys.executable  # optuna-dashboard's app behind the Host/Origin guard (dashboard_guard)
    assert dash.argv[1:] == ("-m", "hmmscope.ui.dashboard_guard", "--host=127.0.0.1", "--port=8081", "--", storage)
    assert (dash.url, dash.path, dash.needs_200) == ("http://127.0.0.1:8081", "/", False)
    env = servers.server_env()
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false" and env["PATH"] == os.environ["PATH"]


WEIRD = "a b;$(touch pwned)&|<>*`x` --disable-security-middleware"


def test_mlflow_ui_argv_keeps_each_value_whole(tmp_path):
    """Known answer: the URI with spaces and ` --flag` is one element, joined to its option with '='."""
    uri = f"sqlite:///{tmp_path}/{WEIRD}/mlflow.db --disable-security-middleware --static-prefix /x"
    s = servers.mlflow_ui(uri, 5123)
    served = tracking.server_uri(uri)
    assert s.argv[1:4] == ("ui", f"--backend-store-uri={served}", f"--registry-store-uri={served}")
    assert "--disable-security-middleware" not in s.argv and "--static-prefix" not in s.argv
    assert "--port=5123" in s.argv and "--host=127.0.0.1" in s.argv
    d = servers.Server("x", ("a",), "u", "/", False)  # a Server holds a tuple: never a string to split
    assert isinstance(d.argv, tuple)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/cmdline")
def test_ui_child_argv_from_a_weird_folder_and_an_injected_uri(tmp_path):
    """Before: shlex.split of one string put `--disable-security-middleware` into mlflow's argv, and a folder
    with a space split the store path in two."""
    folder = tmp_path / WEIRD
    folder.mkdir()
    uri = f"sqlite:///{folder}/ml flow.db --disable-security-middleware --static-prefix /x"
    exe = Path(sys.executable).parent / "hmmscope"
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([str(exe), "ui", "--create", "--port", str(_free_port()), "--tracking-uri", uri], cwd=folder,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    kids: list[int] = []
    try:
        deadline = time.time() + 120
        argv = None
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            own = f.read()  # a child forked and not yet exec'd has this one (a full run here took it for MLflow's)
        while argv is None:
            assert proc.poll() is None, f"hmmscope ui exited {proc.returncode}: {proc.stderr.read().decode()}"
            assert time.time() < deadline, "no MLflow child within 120 s"
            for k in _children(proc.pid):
                kids.append(k)
                with contextlib.suppress(OSError), open(f"/proc/{k}/cmdline", "rb") as f:
                    raw = f.read()
                    parts = [a.decode() for a in raw.split(b"\0")[:-1]]
                    if raw != own and "ui" in parts:
                        argv = parts
            time.sleep(0.05)
        i = argv.index("ui")
        served = tracking.server_uri(uri)
        assert argv[i + 1:i + 3] == [f"--backend-store-uri={served}", f"--registry-store-uri={served}"]
        assert "--disable-security-middleware" not in argv and "--static-prefix" not in argv
        assert not (folder / "pwned").exists() and not (tmp_path / "pwned").exists()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for k in kids:  # they die with their parent; make sure, by pid
            try:
                os.killpg(k, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_a_store_path_with_quotes_is_refused_in_one_line(tmp_path):
    """MLflow puts the artifact folder into an SQL string literal when it creates a store: a quote in the path
    broke `hmmscope ui` with a traceback (exit 1). Now one line, before anything is created."""
    from hmmscope import store_checks
    from hmmscope.config import ConfigError

    with pytest.raises(ConfigError, match="quotes") as e:
        store_checks.tracking_store(f"sqlite:///{tmp_path}/it's/mlflow.db")
    assert "\n" not in str(e.value) and not (tmp_path / "it's").exists()


@linux
def test_supervise_gives_up_on_a_server_that_never_answers(tmp_path):
    """Before: `hmmscope ui` polled /health forever when its server neither answered nor exited."""
    port = _free_port()
    t0 = time.monotonic()
    got = servers.supervise([servers.Server("mute", (sys.executable, "-c", "import time; time.sleep(300)"),
                                            f"http://127.0.0.1:{port}", "/health", True)],
                            {**os.environ, "TMPDIR": str(tmp_path)}, deadline_s=1.5)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # supervise leaves them ignored for its caller
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    assert got is not None and got.message == f"mute did not answer http://127.0.0.1:{port}/health within 2 s"
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------- optuna-dashboard's Host/Origin guard (issue 30, item 4)


def _request(port: int, method: str, path: str, headers: dict[str, str]) -> int:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_host=True)
        for k, v in headers.items():
            c.putheader(k, v)
        c.endheaders()
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def test_the_host_header_is_parsed_strictly_as_host_and_port():
    """Issue 47, item 5: `[::1]evil.example`, `[::1]@evil` and `[::1]:80@evil.example` passed as loopback (the name
    was cut at the first `]`). A Host is host[:port] exactly; an Origin scheme://host[:port]."""
    from hmmscope.ui.dashboard_guard import loopback_host, loopback_origin, refusal

    for good in ("127.0.0.1", "127.0.0.1:8080", "localhost", "LocalHost:1", "[::1]", "[::1]:80", " [::1]:8080 "):
        assert loopback_host(good), good
    for bad in ("[::1]evil.example", "[::1]@evil", "[::1]:80@evil.example", "127.0.0.1:80@evil.example",
                "127.0.0.1@evil", "localhost.evil.example", "127.0.0.1/x", "[::1]:80/x", "::1", "127.0.0.1:80:80",
                "[::1", "", None, "127.0.0.1:123456", "evil.example:80"):
        assert not loopback_host(bad), bad
        assert refusal({"HTTP_HOST": bad, "REQUEST_METHOD": "GET"}) is not None
    for good in ("http://127.0.0.1:8080", "https://[::1]", "http://localhost"):
        assert loopback_origin(good), good
    for bad in ("http://[::1]evil.example", "http://[::1]@evil", "http://127.0.0.1@evil.example", "ftp://127.0.0.1",
                "http://127.0.0.1/path", "null", "127.0.0.1"):
        assert not loopback_origin(bad), bad


def test_dashboard_refuses_a_foreign_host_and_a_cross_origin_write(tmp_path):
    """Before: a DELETE with `Host: rebind.evil.example` removed a study (204), what DNS rebinding needs; the MLflow UI
    refused it (403). Now the real dashboard, started as `hmmscope ui` starts it, refuses that and a write from
    another origin, and serves its own pages and a same-origin write."""
    import optuna

    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ids = {n: optuna.create_study(study_name=n, storage=storage)._study_id for n in ("keep", "mine")}
    port = _free_port()
    s = servers.optuna_dashboard(storage, port)
    log = open(tmp_path / "dash.log", "wb")
    p = subprocess.Popen(list(s.argv), stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not servers.answers(s.url + "/", ok_only=False):
            assert p.poll() is None and time.time() < deadline, (tmp_path / "dash.log").read_text()[-2000:]
            time.sleep(0.25)
        own = {"Host": f"127.0.0.1:{port}"}
        assert _request(port, "GET", "/dashboard", own) == 200
        assert _request(port, "GET", "/api/studies", {"Host": f"localhost:{port}"}) == 200
        assert _request(port, "GET", "/api/studies", {"Host": "rebind.evil.example"}) == 403
        assert _request(port, "DELETE", f"/api/studies/{ids['keep']}", {"Host": "rebind.evil.example"}) == 403
        assert _request(port, "DELETE", f"/api/studies/{ids['keep']}", {**own, "Origin": "http://evil.example"}) == 403
        assert _request(port, "DELETE", f"/api/studies/{ids['keep']}", {**own, "Sec-Fetch-Site": "cross-site"}) == 403
        assert _request(port, "DELETE", f"/api/studies/{ids['keep']}", {}) == 403  # no Host at all
        assert {st.study_name for st in optuna.get_all_study_summaries(storage)} == {"keep", "mine"}
        assert _request(port, "DELETE", f"/api/studies/{ids['mine']}",
                        {**own, "Origin": f"http://127.0.0.1:{port}"}) == 204  # the dashboard's own page may
        assert {st.study_name for st in optuna.get_all_study_summaries(storage)} == {"keep"}
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
        log.close()
