"""Development tooling, not the training API: what the scripts, tests and benchmarks use.

* ``tiny_model``: a tiny Qwen2-style model and tokenizer built offline (``build_tiny_model``);
* ``real_model``: SmolLM2-135M-Instruct as a Hugging Face checkpoint, built offline (``build_smollm2``);
* ``cpu_vllm``: a CPU vLLM server started and stopped by PID;
* ``batches``: training rows interleaved by ground truth (``interleave_by_ground_truth``);
* ``frozen_lake_rows``: rows for eval-protocol's FrozenLake benchmark, one lake per seed (``--input-dataset``);
* ``record_demonstrations``: demonstrations of an eval's tool calls by a scripted player (``--warm-start``);
* ``run_record``: what a result file records about its run (command, commit, clean tree or not, machine, load),
  written by the benchmarks, the training scripts and ``ep-trl train``.

The training scripts' progress lines, environment server, generation modes and held-out scoring are ``ep_trl.cli``'s
(the scripts are presets of ``ep-trl train``). ``run_record`` stays here: the benchmarks write it into every result
file, and ``ep-trl train`` into its ``result.json``.
"""
