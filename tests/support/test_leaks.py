"""The suite's leak check (tests/support/leaks.py) fails a module that leaves a thread or a child process behind, and
does not fail one that only made a library start its process-wide pool. Each case runs pytest in a subprocess, so
what it leaves is that subprocess's, not this module's."""

import os
import textwrap
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def run_module(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, body: str, **env: str) -> pytest.RunResult:
    pytester.makepyfile(test_module=textwrap.dedent(body))
    for name, value in {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'src'}", **env}.items():
        monkeypatch.setenv(name, value)
    return pytester.runpytest_subprocess(
        "-p", "tests.support.leaks", "-p", "no:cacheprovider", "-p", "no:eval_protocol", timeout=120
    )


def ended(pytester: pytest.Pytester, pid_file: str) -> bool:
    """Whether the process whose pid the module wrote to ``pid_file`` is gone (a zombie counts as gone)."""
    pid = int((pytester.path / pid_file).read_text())
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_module_that_leaves_a_thread_and_a_child_behind_errors_naming_both(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_module(
        pytester,
        monkeypatch,
        """
        import subprocess, threading, time
        from pathlib import Path

        def test_starts_and_forgets():
            threading.Thread(target=time.sleep, args=(60,), name="forgotten-worker", daemon=True).start()
            child = subprocess.Popen(["sleep", "60"])
            Path("child.pid").write_text(str(child.pid))
        """,
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*left behind*thread 'forgotten-worker' (daemon)*child process pid *sleep 60*"])
    assert ended(pytester, "child.pid")


def test_a_library_pool_kept_for_the_process_is_not_a_leak(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch inductor keeps its compile workers for the process once a compile with a cold cache used them (the
    colocated vision test left 'ThreadPoolExecutor-8_0' on a clean CI machine)."""
    result = run_module(
        pytester,
        monkeypatch,
        """
        from torch._inductor.async_compile import AsyncCompile

        def test_compiles():
            assert AsyncCompile.pool().submit(sum, [1, 2]).result() == 3
        """,
        TORCHINDUCTOR_COMPILE_THREADS="2",
    )
    result.assert_outcomes(passed=1)
    assert "left behind" not in result.stdout.str()


def test_a_test_that_times_out_still_stops_its_server_by_pid(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest-timeout (the suite's 600 s limit) ends a hung test inside the test session, so the fixture's finalizer
    still stops the server it started, by PID, and the session ends with nothing left."""
    result = run_module(
        pytester,
        monkeypatch,
        """
        import sys
        from pathlib import Path

        import pytest
        from ep_trl.runtime.processes import free_port, start_server

        @pytest.fixture
        def server(tmp_path):
            port = free_port()
            proc = start_server("http", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                port=port, log_dir=tmp_path, health_path="/")
            Path("server.pid").write_text(str(proc.pid))
            yield proc
            proc.stop()

        @pytest.mark.timeout(3)
        def test_hangs(server):
            import time
            time.sleep(60)
        """,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Timeout*"])
    assert "left behind" not in result.stdout.str()
    assert ended(pytester, "server.pid")
