"""The BrowserGym MiniWoB++ server end to end, with real Chromium.

One server subprocess for the module (start-up imports BrowserGym and checks
the browser, so it is paid once). Tests talk to it through ``BrowserGymEnv``
exactly as rollouts do and inspect the server's process tree with psutil to
prove browsers are closed with their sessions.
"""

import asyncio
import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ep_trl.envs.browsergym import BrowserGymEnv, browsergym_action_parser, build_prompt, build_user_content
from ep_trl.envs.browsergym.actions import parse_action
from ep_trl.runtime.processes import ServerProcess, free_port, start_server

pytestmark = pytest.mark.slow

#: Processes a session adds under the server: Playwright's node driver and Chromium's tree.
_BROWSER_NAMES = {"node", "chromium", "chrome", "chrome_crashpad_handler"}
_CLICK_TEST_BUTTON = re.compile(r"\[(\w+)\] button 'Click Me!'")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The BrowserGym server on a free local port, stopped (with its process group) afterwards."""
    port = free_port()
    proc = start_server(
        "browsergym",
        [sys.executable, "-m", "ep_trl.envs.browsergym", "--host", "127.0.0.1", "--port", str(port)],
        port=port,
        log_dir=tmp_path_factory.mktemp("browsergym-logs"),
        env={"BROWSERGYM_MAX_SESSIONS": "2"},
        timeout_s=120,
    )
    try:
        yield proc
    finally:
        proc.stop()


def _browser_processes(server: ServerProcess) -> list[psutil.Process]:
    """Live browser-related descendants of the server process."""
    found = []
    for child in psutil.Process(server.pid).children(recursive=True):
        try:
            if child.name() in _BROWSER_NAMES and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _wait_no_browsers(server: ServerProcess, timeout_s: float = 15.0) -> list[psutil.Process]:
    """Poll until the server has no browser processes left; return what remains at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = _browser_processes(server)
        if not remaining or time.monotonic() > deadline:
            return remaining
        time.sleep(0.2)


def test_click_test_episode_errors_and_cleanup(server: ServerProcess) -> None:
    """Reset click-test, survive bad actions, click the button for reward 1, and leak no browser.

    Uses the blocking ``.sync()`` client, the way eval-protocol's processor drives envs.
    """
    env = BrowserGymEnv(base_url=server.base_url).sync()
    try:
        result = env.reset(task_name="click-test", seed=7)
        obs = result.observation
        assert obs.goal == "Click the button."
        assert obs.url.endswith("click-test.html")
        assert not result.done and obs.last_action_error == ""
        match = _CLICK_TEST_BUTTON.search(obs.axtree_txt)
        assert match, obs.axtree_txt
        bid = match.group(1)
        assert bid in obs.clickable_bids
        assert f'bid="{bid}"' in obs.pruned_html
        assert obs.screenshot is None  # off by default
        assert _browser_processes(server), "an open session should own a browser"

        prompt = build_prompt(obs, 1, [])
        assert "Goal: Click the button." in prompt and f"[{bid}] button 'Click Me!'" in prompt

        missing = env.step(browsergym_action_parser("click('no-such-element')"))
        assert "no-such-element" in missing.observation.last_action_error
        assert missing.reward == 0.0 and not missing.done

        garbage = env.step("this is not an action")
        assert garbage.observation.last_action_error, "a bad action string must be reported, not crash"
        assert not garbage.done

        final = env.step(browsergym_action_parser(f"I will press the button.\nAction: click({bid})"))
        assert final.observation.last_action_error == ""
        assert final.reward == 1.0
        assert final.done
        assert final.observation.info["action_metadata"]["fell_back"] is False

        state = env.state()
        assert state.task_name == "click-test" and state.seed == 7
        assert state.step_count == 3 and state.cum_reward == 1.0 and state.done
    finally:
        env.close()
    assert _wait_no_browsers(server) == [], "browser processes outlived their session"


def test_unknown_task_then_screenshot_prompt_parts(server: ServerProcess) -> None:
    """An unknown task is a clear error that leaves the session usable; screenshots flow into content parts."""

    async def run() -> None:
        env = BrowserGymEnv(base_url=server.base_url)
        try:
            with pytest.raises(RuntimeError, match="Unknown MiniWoB task 'clik-test'.*click-test"):
                await env.reset(task_name="clik-test")
            result = await env.reset(task_name="click-test", screenshot=True)
            png = base64.b64decode(result.observation.screenshot or "")
            assert png.startswith(b"\x89PNG\r\n\x1a\n")
            content = build_user_content(result.observation, 1, ["Step 0: noop()"])
            assert isinstance(content, list)
            assert content[0]["type"] == "text" and "Click the button." in content[0]["text"]
            assert content[1]["image_url"]["url"].startswith("data:image/png;base64,")
        finally:
            await env.close()

    asyncio.run(run())
    assert _wait_no_browsers(server) == []


def test_two_concurrent_sessions_each_solve_click_test(server: ServerProcess) -> None:
    """Two sessions (the default maximum) run at once, each with its own browser, and both close cleanly."""

    async def episode(seed: int) -> float:
        env = BrowserGymEnv(base_url=server.base_url, task_name="click-test")
        try:
            result = await env.reset(seed=seed)
            button = _CLICK_TEST_BUTTON.search(result.observation.axtree_txt)
            assert button is not None, result.observation.axtree_txt
            bid = button.group(1)
            result = await env.step(parse_action(f"click('{bid}')").action_str)
            assert result.done
            return float(result.reward or 0.0)
        finally:
            await env.close()

    async def run() -> list[float]:
        return list(await asyncio.gather(episode(1), episode(2)))

    assert asyncio.run(run()) == [1.0, 1.0]
    assert _wait_no_browsers(server) == []
    assert server.proc.poll() is None, f"server died:\n{server.output_tail()}"


def test_install_script_is_idempotent() -> None:
    """Re-running the install script on an installed machine changes nothing and still launches Chromium."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "install_browser.sh"
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chromium already installed" in done.stdout
    assert "playwright chromium already linked" in done.stdout
    assert "headless: OK" in done.stdout
