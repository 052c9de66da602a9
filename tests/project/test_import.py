"""What ``import ep_trl`` loads, and what a processor eval's run loads: OpenEnv only for an OpenEnv environment.

``openenv.core`` imports gradio, fastmcp and IPython (seconds). ``import ep_trl`` used to load it through
``env_servers``; every shard process and user script paid for it, including those whose eval has no OpenEnv
environment. Each check runs in a fresh interpreter, since this test process has OpenEnv loaded by other tests.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ep_trl.runtime.processes import free_port, start_server

REPO = Path(__file__).resolve().parents[2]
#: Top-level packages that only an OpenEnv environment may bring in.
HEAVY = ("openenv", "gradio", "fastmcp", "IPython")

LOADED = f"sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))"

#: Plays two episodes of each processor eval through ep_trl's rollout function (in-process generation, a real CPU
#: GRPOTrainer as the caller), then prints their statuses and which of HEAVY were imported.
PROCESSOR_RUN = f"""
import json, sys
from pathlib import Path
from ep_trl import create_openenv_vllm_rollout_func, dataset_from_eval
from tests.support.trainers import make_trainer

model_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
statuses = {{}}
for name, env_path in [("single_turn", "tests/evals/eval_arithmetic.py::test_arithmetic"),
                       ("agent", "tests.evals.eval_calculator_agent")]:
    rollout = create_openenv_vllm_rollout_func(env_path, log_rollouts=False)
    prompts = dataset_from_eval(env_path, repeat=2)["prompt"][:2]
    trainer = make_trainer(model_dir, work / name, rollout, num_generations=2, batch_size=2, max_steps=1,
                           max_completion_length=24, prompts=prompts)
    try:
        out = rollout(prompts, trainer)
    finally:
        rollout.close()
    statuses[name] = [out["episode_status"], out["num_turns"]]
print(json.dumps({{"statuses": statuses, "loaded": {LOADED}}}))
"""


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> dict:
    """``python -c code args`` from the repository root with this worktree's ``src`` first; its last stdout line
    as JSON."""
    full_env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_ep_trl_loads_no_openenv() -> None:
    """``import ep_trl`` (every public name) imports neither OpenEnv nor gradio; the launcher of environment
    servers imports OpenEnv's provider interface when it starts one."""
    loaded = run_python(
        f"import json, sys, ep_trl; from ep_trl import *; import ep_trl.openenv.servers; print(json.dumps({LOADED}))"
    )
    assert loaded == []
    provider = run_python(
        "import json, sys; from ep_trl.openenv.local_provider import LocalAppProvider; "
        "from openenv.core.containers.runtime import RuntimeProvider; "
        "print(json.dumps(issubclass(LocalAppProvider, RuntimeProvider)))"
    )
    assert provider is True


def test_import_ep_trl_alone_loads_only_the_errors_and_options() -> None:
    """``import ep_trl`` costs what its errors and options cost, with the finder of the old paths (``compat``: issue
    40: it loaded the whole bridge, eval-protocol, aiohttp and transformers); each public name is imported at first
    use and is the object its module defines."""
    loaded = run_python(
        "import json, sys, ep_trl; print(json.dumps({"
        "'ep_trl': sorted(m for m in sys.modules if m.startswith('ep_trl')), "
        "'libraries': sorted({m.split('.')[0] for m in sys.modules} & "
        "{'aiohttp', 'eval_protocol', 'litellm', 'transformers', 'torch', 'numpy', 'trl'})}))"
    )
    assert loaded == {"ep_trl": ["ep_trl", "ep_trl.compat", "ep_trl.errors", "ep_trl.options"], "libraries": []}
    public = run_python("""
import json, ep_trl, ep_trl.dataset, ep_trl.adapters.rollout_func, ep_trl.adapters.async_worker
import ep_trl.errors, ep_trl.options
from ep_trl import *
homes = (ep_trl.dataset, ep_trl.adapters.rollout_func, ep_trl.adapters.async_worker, ep_trl.errors, ep_trl.options)
same = {name: any(getattr(home, name, None) is globals()[name] is getattr(ep_trl, name) for home in homes)
        for name in ep_trl.__all__}
try:
    ep_trl.no_such_name
    missing = "no error"
except AttributeError as error:
    missing = str(error)
print(json.dumps({"same": same, "missing": missing, "listed": sorted(set(ep_trl.__all__) - set(dir(ep_trl)))}))
""")
    assert public["same"] and all(public["same"].values()), public["same"]
    assert public["missing"] == "module 'ep_trl' has no attribute 'no_such_name'" and public["listed"] == []


@pytest.mark.timeout(300)
def test_a_processor_eval_never_imports_gradio(qwen_template_model_dir: Path, tmp_path: Path) -> None:
    """A single-turn eval (``SingleTurnRolloutProcessor``) and an MCP agent eval (``AgentRolloutProcessor``, its
    tools from a real MCP server) play their episodes without OpenEnv, gradio, fastmcp or IPython being imported."""
    port = free_port()
    calc = start_server(
        "calc-mcp",
        [sys.executable, str(REPO / "tests/fixtures/calc_mcp_server.py"), str(port)],
        port=port,
        log_dir=tmp_path / "calc_logs",
        cwd=REPO,
    )
    try:
        config = tmp_path / "calc_mcp.json"
        config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{calc.base_url}/mcp"}}}))
        result = run_python(
            PROCESSOR_RUN,
            str(qwen_template_model_dir),
            str(tmp_path / "work"),
            env={"CALC_MCP_CONFIG": str(config)},
            timeout=240,
        )
    finally:
        calc.stop()
    assert result["statuses"]["single_turn"] == [["finished", "finished"], [1, 1]]
    agent_statuses, agent_turns = result["statuses"]["agent"]
    assert agent_statuses == ["finished", "finished"] and min(agent_turns) >= 1
    assert result["loaded"] == []


def test_importing_every_module_of_the_cli_runs_no_command() -> None:
    """A tool that imports every module of a package (``pkgutil``, a documentation builder) with argv of its own:
    ``ep_trl.cli.__main__`` ran ``ep-trl`` on import and exited 2; it runs only as ``python -m ep_trl.cli``."""
    code = (
        "import importlib, pkgutil, sys; import ep_trl.cli as cli; sys.argv = ['a-doc-builder', '--its-own-flag']; "
        "names = [m.name for m in pkgutil.walk_packages(cli.__path__, 'ep_trl.cli.')]; "
        "[importlib.import_module(n) for n in names]; print(sorted(names))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'ep_trl.cli.__main__'" in done.stdout
    ran = subprocess.run([sys.executable, "-m", "ep_trl.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "ep-trl" in ran.stdout
