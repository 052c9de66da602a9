#!/usr/bin/env bash
# Run the model tests with their trainers and reference models on the GPU: EP_TRL_TEST_DEVICE=cuda (tests/support/
# device.py) sets use_cpu=False in the tests' GRPOConfigs and moves the models the generation and image-seam tests
# build; teacher-forced reference logprobs are computed where the model is. Generation servers stay as they are.
#
#   bash scripts/test_gpu.sh                 # the trainer backend, image seam and single-turn training tests
#   bash scripts/test_gpu.sh -k images       # extra pytest arguments
#
# Needs a Python with ep_trl's test dependencies and a CUDA build of torch (docs/vllm.md, "Tests on a GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'test_gpu.sh: torch sees no GPU here (torch ' + torch.__version__ + '); run it on a machine with one')"
EP_TRL_TEST_DEVICE=cuda exec "$PY" -m pytest -q -p no:eval_protocol \
  tests/generation/test_trainer.py tests/generation/test_trainer_images.py tests/trainers/test_images.py \
  tests/adapters/test_training.py "$@"
