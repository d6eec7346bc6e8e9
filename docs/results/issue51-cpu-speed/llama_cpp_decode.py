"""Issue 51, item 4: llama.cpp's decode speed on the same GGUF, threads and context as
`hisparse run --model`, the anchor a user would pick (llama-cpp-python, built from PyPI's source
package on this machine).

Prefills a window of `--context` tokens of `--text` (llama.cpp's own tokenizer), then decodes
`--decode` tokens greedily one at a time, timing each `eval` of one token; prints the median,
minimum and maximum seconds per token over the last `--decode - 4` steps (the first 4 are
warm-up) and tokens/s from the median, one JSON line.

Usage: python llama_cpp_decode.py GGUF TEXT --context 2048 --decode 64 --threads 2
"""

import argparse
import json
import statistics
import time

import llama_cpp
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("gguf")
    p.add_argument("text")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    llm = llama_cpp.Llama(
        model_path=a.gguf,
        n_ctx=a.context + a.decode + 8,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=512,
        logits_all=False,
        verbose=False,
    )
    with open(a.text, "rb") as f:
        tokens = llm.tokenize(f.read(), add_bos=True)
    if len(tokens) < a.context:
        raise SystemExit(f"--context {a.context}: the text has {len(tokens)} tokens")
    t0 = time.perf_counter()
    llm.eval(tokens[: a.context])
    prefill = time.perf_counter() - t0
    times = []
    for _ in range(a.decode):
        # The last token's logits, as llama.cpp left them (greedy: the largest).
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        tok = int(np.argmax(logits))
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
    steady = times[4:]
    med = statistics.median(steady)
    print(
        json.dumps(
            {
                "engine": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__,
                "context": a.context,
                "threads": a.threads,
                "prefill_s": round(prefill, 3),
                "decode_steps": len(steady),
                "s_per_token": {"min": min(steady), "median": med, "max": max(steady)},
                "tokens_per_s": 1.0 / med,
            }
        )
    )


if __name__ == "__main__":
    main()
