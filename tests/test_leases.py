"""The lease never degrades (issue 36, item 3): without its OS lock a writer does not run.

Before: when `mlruns/.leases` could not be used (a plain file there; a shared store whose `.leases` another user had
created 0700, as hmmscope created it) `hold` took no lock and said nothing, so two `train --resume` of one run both
trained; a `.leases` that was a link out of the project had lock files (host and pid) written through it. Now:
- no lock, no writer: one line naming the folder and why (`LeaseUnavailable`, a ValueError: exit 2 at the CLI);
- `.leases` is opened as a real folder inside the store (never through a link), and `runs gc` never removes through
  one;
- a store others may write (its folder group- or world-writable) gets a `.leases` they can use too (the store
  folder's write bits, sticky) with lock files they can open, so a shared store keeps one writer per run across
  users. The cross-user cases drop to the user `nobody` in a forked child (root only: CI runs as root).
"""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from pathlib import Path

import pytest

from hmmscope import tracking
from hmmscope.tracking import hold as holding
from hmmscope.tracking import leftovers


def _run(folder: Path) -> tuple[str, str]:
    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    with tracking.start_run(uri, "exp", "r") as run:
        pass
    return uri, run.run_id


def test_a_plain_file_in_place_of_the_lease_folder_refuses_the_writer(tmp_path):
    uri, rid = _run(tmp_path)
    leases = tmp_path / "mlruns" / ".leases"
    for p in leases.iterdir():
        p.unlink()
    leases.rmdir()
    leases.write_text("not a folder")
    with pytest.raises(holding.LeaseUnavailable, match=f"{leases}.*not a folder"):
        with tracking.hold_run(uri, rid):
            pytest.fail("held a run without its lock")
    with pytest.raises(holding.LeaseUnavailable, match=str(leases)):
        with tracking.start_run(uri, "exp", "", resume=rid):
            pytest.fail("reopened a run without its lock")
    assert tracking.get_run(uri, rid).info.status == "FINISHED"  # nothing written into the run


def test_a_lease_folder_linked_out_of_the_store_is_never_written_through(tmp_path):
    uri, rid = _run(tmp_path / "proj")
    leases = tmp_path / "proj" / "mlruns" / ".leases"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{rid}.lock").write_text("theirs")
    for p in leases.iterdir():
        p.unlink()
    leases.rmdir()
    leases.symlink_to(outside, target_is_directory=True)
    with pytest.raises(holding.LeaseUnavailable, match=f"{leases}.*link"):
        with tracking.hold_run(uri, rid):
            pytest.fail("held a run through a linked lease folder")
    assert leftovers.free_locks(uri) == 0  # gc never removes through the link
    assert sorted(p.name for p in outside.iterdir()) == [f"{rid}.lock"]
    assert (outside / f"{rid}.lock").read_text() == "theirs"


def _as_nobody(fn) -> tuple[int, str]:
    """fn() in a forked child running as the user nobody; (exit code, what it wrote back)."""
    nobody = pwd.getpwnam("nobody")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            msg = str(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg, code = f"{type(e).__name__}: {e}", 3
        os.write(w, msg.encode()[:4000])
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


@pytest.fixture
def shared(tmp_path):
    """A folder every user can reach (pytest's own temp folders are private to root)."""
    d = Path(tempfile.mkdtemp(prefix="hmmscope-shared-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="acts as another user (setuid to nobody): needs root")
def test_another_users_private_lease_folder_refuses_the_writer_in_one_line(shared):
    """Before: a shared store whose .leases another user made 0700: no lock, no word, two writers."""
    proj = shared / "proj"
    proj.mkdir()
    uri, rid = _run(proj)
    (proj / "mlruns").chmod(0o777)
    (proj / "mlruns" / "mlflow.db").chmod(0o666)
    leases = proj / "mlruns" / ".leases"
    leases.chmod(0o700)  # root's, private: as hmmscope created it before

    def hold():
        with tracking.hold_run(uri, rid):
            return "held"

    code, out = _as_nobody(hold)
    assert code == 3 and out.startswith("LeaseUnavailable: ") and str(leases) in out and "\n" not in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="acts as another user (setuid to nobody): needs root")
def test_a_shared_store_gives_every_user_the_lease_and_still_one_writer(shared):
    proj = shared / "proj"
    (proj / "mlruns").mkdir(parents=True)
    (proj / "mlruns").chmod(0o777)  # a store its users share
    uri, rid = _run(proj)
    (proj / "mlruns" / "mlflow.db").chmod(0o666)
    leases = proj / "mlruns" / ".leases"
    mode = leases.stat().st_mode
    assert mode & stat.S_ISVTX and stat.S_IMODE(mode) & 0o002, oct(mode)  # others may lock, not remove others' locks

    def hold():
        holding._HELD.clear()  # a forked child inherits the parent's holds: it is another process
        with tracking.hold_run(uri, rid):
            return "held"

    code, out = _as_nobody(hold)
    assert (code, out) == (0, "held")
    with tracking.hold_run(uri, rid):  # root holds it: nobody is refused, naming the holder
        code, out = _as_nobody(hold)
    assert code == 3 and out.startswith("RunHeld: ") and f"process {os.getpid()}" in out, out
