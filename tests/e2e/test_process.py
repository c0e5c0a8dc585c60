"""Engine server processes handled as a careful operator would: a free loopback port, a health
check, start-up and request timeouts naming the server and its log, a restart after a death
or a hang, and no process left behind, even when the process that started the server is killed
outright (``PR_SET_PDEATHSIG`` from the launcher thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from losslessness.adapters.e2e.process import EngineProcessError, ServerProcess
from tests.e2e.processes import gone

FAKE = str(Path(__file__).with_name("fake_server.py"))
FAKE_SHIM = str(Path(__file__).with_name("fake_shim.py"))


def server(mode: str, **options: float) -> ServerProcess:
    return ServerProcess(f"fake ({mode})", [sys.executable, FAKE, "{port}", mode], **options)


def test_a_healthy_server_answers_on_loopback_and_its_whole_group_is_stopped() -> None:
    """The server starts on a free 127.0.0.1 port, answers, and stop() ends it and the child
    it started; a second stop() is harmless."""
    with server("spawn") as engine:
        assert engine.port is not None and engine.alive
        assert engine.request_json("/echo", {"x": 1})["echo"] == {"x": 1}
        pids = engine.request_json("/pid")
    assert not engine.alive and gone(pids["pid"]) and gone(pids["child"])
    engine.stop()


def test_a_server_that_exits_at_start_up_is_an_error_with_its_exit_code_and_log() -> None:
    """Exit code 3 and the server's own words are in the message; nothing is left running."""
    engine = server("exit")
    with pytest.raises(EngineProcessError, match=r"exited during start-up \(exit code 3") as info:
        engine.start()
    assert "refusing to start" in str(info.value) and not engine.alive


def test_a_server_never_healthy_is_stopped_at_the_start_up_timeout() -> None:
    """503 for ever: an error after ``startup_timeout_s`` naming it, and the process stopped."""
    engine = server("never-healthy", startup_timeout_s=2.0)
    began = time.monotonic()
    with pytest.raises(EngineProcessError, match="not healthy within 2 s"):
        engine.start()
    assert time.monotonic() - began < 15 and not engine.alive


@pytest.mark.parametrize(("mode", "message"), [("hang", "did not answer within 1 s"),
                                               ("crash", "failed")])
def test_a_request_that_hangs_or_kills_the_server_is_an_error_and_the_next_one_restarts_it(
    mode: str, message: str
) -> None:
    """One failed request is an error naming the server; the following request starts a fresh
    server (the audit's next case runs)."""
    engine = server(mode, request_timeout_s=1.0)
    try:
        engine.start()
        first_pid = engine.request_json("/pid")["pid"]
        with pytest.raises(EngineProcessError, match=message):
            engine.request_json("/echo", {"x": 1})
        assert gone(first_pid)
        assert engine.request_json("/pid")["pid"] != first_pid and engine.starts == 2
    finally:
        engine.stop()


def test_a_request_to_a_server_on_its_way_out_goes_to_a_fresh_one() -> None:
    """A request that makes the server end is an error; the next one finds the process still
    running but nothing listening (connection refused: it never reached the server), so it is
    sent to a fresh server instead of failing too (vLLM's shim ends itself after its engine
    died: the case after the one that killed it was an ERROR in a night's run)."""
    engine = server("dying", request_timeout_s=10.0)
    try:
        first_pid = engine.request_json("/pid")["pid"]
        with pytest.raises(EngineProcessError, match="failed"):
            engine.request_json("/echo", {"x": 1})
        assert engine.alive
        assert engine.request_json("/pid")["pid"] != first_pid and engine.starts == 2
        assert gone(first_pid)
    finally:
        engine.stop()


def test_a_server_started_from_a_short_lived_thread_outlives_the_thread() -> None:
    """Audit calls may run on daemon threads: the server is forked by the launcher thread, so
    the death signal does not fire when the calling thread ends."""
    engine = server("ok")
    started = threading.Thread(target=engine.start)
    started.start()
    started.join()
    try:
        time.sleep(0.5)
        assert engine.alive and engine.request_json("/echo", {"y": 2})["echo"] == {"y": 2}
    finally:
        engine.stop()


def test_no_server_outlives_a_process_killed_outright() -> None:
    """SIGKILL the process that started a server (as the audit kills a timed-out worker): the
    kernel stops the server too."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from losslessness.adapters.e2e.process import ServerProcess
        engine = ServerProcess("fake", [sys.executable, {FAKE!r}, "{{port}}", "ok"])
        engine.start()
        print(engine.request_json("/pid")["pid"], flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        os.kill(pid, 0)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert gone(pid)
    finally:
        parent.kill()
        parent.wait()


def test_a_shims_engine_processes_do_not_outlive_the_process_that_started_the_shim() -> None:
    """SIGKILL the process that started a shim whose engine spawned processes of its own (as
    vLLM's LLM does): the shim gets SIGTERM from the kernel (``death_signal``) and SIGKILLs its
    whole process group, so the engine process goes too, not only the shim."""
    script = textwrap.dedent(f"""
        import signal, sys, time
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from losslessness.adapters.e2e.process import ServerProcess
        shim = ServerProcess("fake shim", [sys.executable, {FAKE_SHIM!r}, "{{port}}"],
                             death_signal=signal.SIGTERM)
        shim.start()
        pids = shim.request_json("/pids", {{}})
        print(pids["shim"], pids["engine"], flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        shim, engine = map(int, parent.stdout.readline().split())
        os.kill(engine, 0)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert gone(shim) and gone(engine)
    finally:
        parent.kill()
        parent.wait()


def test_a_keep_alive_connection_the_server_closed_is_reopened_once() -> None:
    """Servers close idle keep-alive connections (llama-server does after a few seconds): the
    next request goes out on a fresh connection instead of failing with a broken pipe."""
    with server("ok") as engine:
        engine.request_json("/echo", {"n": 1})
        assert engine._connection is not None and engine._connection.sock is not None
        engine._connection.sock.shutdown(2)
        assert engine.request_json("/echo", {"n": 2})["echo"] == {"n": 2}
        assert engine.starts == 1


def test_a_default_log_is_removed_at_exit_unless_an_error_named_it() -> None:
    """A server given no log path writes to a temporary file; at interpreter exit
    (``remove_temporary_logs``) that file is removed after a clean run and kept after an error
    that named it (the operator reads it)."""
    from losslessness.adapters.e2e.process import remove_temporary_logs

    with server("spawn") as clean:
        assert clean.request_json("/echo", {"x": 1})["echo"] == {"x": 1}
    failed = server("exit")
    with pytest.raises(EngineProcessError) as info:
        failed.start()
    assert clean.log_path is not None and failed.log_path is not None
    assert clean.log_path.exists() and str(failed.log_path) in str(info.value)
    remove_temporary_logs()
    assert not clean.log_path.exists() and failed.log_path.exists()
    failed.log_path.unlink()
