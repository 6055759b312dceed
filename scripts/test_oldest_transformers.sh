#!/usr/bin/env bash
# Runs tests/python/test_transformers.py against the oldest transformers tileattn.transformers
# claims, 4.53.0 (the first with transformers.masking_utils' AttentionMaskInterface and sdpa_mask,
# which register() needs besides AttentionInterface), installed from PyPI into a separate
# directory (build/transformers-4.53) so the project's .venv keeps its own version.
#   scripts/test_oldest_transformers.sh [PYTHONPATH of an installed tileattn, default: none]
# Needs .venv (scripts/setup.sh; PYTHON=... for another interpreter) with torch, and tileattn importable.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-$root/.venv/bin/python}
target=$root/build/transformers-4.53
if [ ! -f "$target/transformers/__init__.py" ]; then
  # --no-deps: the .venv's numpy, torch, safetensors, regex, pyyaml, tqdm, filelock serve; these
  # are the ones 4.53 pins differently (hub < 1.0, tokenizers < 0.22) or the .venv lacks.
  "$python" -m pip install --no-deps -q --target "$target" "transformers==4.53.0" "huggingface-hub==0.36.0" \
    "tokenizers==0.21.4" requests urllib3 charset_normalizer idna certifi
fi
cd tests/python
PYTHONPATH="$target${1:+:$1}" "$python" -c \
  'import transformers; assert transformers.__version__ == "4.53.0", transformers.__version__'
PYTHONPATH="$target${1:+:$1}" "$python" -m pytest -q test_transformers.py
