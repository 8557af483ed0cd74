#!/usr/bin/env python3
"""Time to first token after a restart: a long prefix read back from the
prompt cache on disk against the same prefix prefilled.

    scripts/bench-prompt-cache.py [--preset small] [--prefix 8000] [--reps 3]
                                  [--ondo target/release/ondo] [--model DIR]
                                  [--synth-args '--dtype f32'] [--run-args '--kv-bits 4']

Every run is a fresh `ondo run` process (a restart), so the model's load is
paid each time and left out of both sides: TTFT is timed from the request
reaching the loaded model. First one run saves the prefix (a prompt of
PREFIX tokens and a suffix, cached when the process ends). Then each round,
in alternating order: the prefix and a new suffix with --no-disk-cache
(prefilled), and the same prompt reading the saved prefix back. Prints the
median and spread of each side's TTFT, the ratio of the medians, the bytes
read and the read speed, and on how many rounds both sides gave the same
greedy tokens. `--drop-caches` asks the kernel to drop its page cache before each
read (root on Linux), so the read comes from the disk and not from memory.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(ondo, model, ids, extra, env):
    out = subprocess.run(
        [ondo, "run", model, "--prompt-ids", ",".join(map(str, ids)), "--json", "--no-history",
         "--max-tokens", "8", "--ignore-eos", *extra],
        capture_output=True, text=True, env=env,
    )
    if out.returncode != 0:
        sys.exit(out.stderr)
    return json.loads(out.stdout)


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--prefix", type=int, default=8000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ondo", default=os.path.join(ROOT, "target/release/ondo"))
    parser.add_argument("--model")
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--synth-args", default="--dtype f32",
                        help="ondo synth's options for the model (default: float32; empty: the preset's "
                             "usual format, 4-bit for the Llama shapes)")
    parser.add_argument("--run-args", default="",
                        help="options for every ondo run, e.g. '--kv-bits 4 --quantized-kv-start 0'")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="ondo-prompt-cache-")
    env = dict(os.environ, ONDO_HOME=os.path.join(work, "home"))
    env.pop("ONDO_PROMPT_CACHE", None)
    model = args.model
    if model is None:
        model = os.path.join(work, "model")
        subprocess.run([args.ondo, "synth", args.preset, model, *args.synth_args.split()], check=True,
                       capture_output=True, env=env)
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    prefix = [3 + (i * 7919) % (vocab - 3) for i in range(args.prefix)]

    def suffix(n):
        return [3 + (n * 131 + i * 17) % (vocab - 3) for i in range(16)]

    common = args.run_args.split()
    saved = run(args.ondo, model, prefix + suffix(0), common, env)
    assert saved["prefix_source"] == "none", saved["prefix_source"]
    prefilled, restored, read_bytes, read_ms, same = [], [], [], [], []
    for rep in range(args.reps):
        ids = prefix + suffix(rep + 1)
        order = ["prefill", "disk"] if rep % 2 == 0 else ["disk", "prefill"]
        results = {}
        for side in order:
            if side == "disk" and args.drop_caches:
                subprocess.run(["sync"], check=True)
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
            extra = common + (["--no-disk-cache"] if side == "prefill" else [])
            results[side] = run(args.ondo, model, ids, extra, env)
        disk, full = results["disk"], results["prefill"]
        assert disk["prefix_source"] == "disk", disk["prefix_source"]
        # Exact on the CPU; a GPU's reductions may tie-break otherwise at
        # long prompts, and a quantized prefix read back attends to
        # quantized keys where a whole prefill's first chunk attends in
        # floats: counted and printed, not asserted.
        same.append(disk["token_ids"] == full["token_ids"])
        prefilled.append(full["ttft_ms"])
        restored.append(disk["ttft_ms"])
        read_bytes.append(disk["prefix_read_bytes"])
        read_ms.append(disk["prefix_read_ms"])
        print(f"round {rep}: prefill {full['ttft_ms']:.1f} ms, from disk {disk['ttft_ms']:.1f} ms "
              f"({disk['cached_tokens']} cached, read {disk['prefix_read_bytes'] / 2**20:.1f} MiB in "
              f"{disk['prefix_read_ms']:.1f} ms)", file=sys.stderr)
    ratio = statistics.median(restored) / statistics.median(prefilled)
    speed = statistics.median(b / 2**20 / (ms / 1e3) for b, ms in zip(read_bytes, read_ms))
    shape = args.preset if args.model is None else "given"
    print(f"prefix {args.prefix} tokens, {args.reps} rounds, model {os.path.basename(model)} ({shape})")
    print(f"TTFT prefilled ms:  {spread(prefilled)}")
    print(f"TTFT from disk ms:  {spread(restored)}")
    print(f"ratio (disk / prefilled): {ratio:.3f}")
    print(f"read {statistics.median(read_bytes) / 2**20:.1f} MiB at {speed:.0f} MiB/s"
          f"{' (page cache dropped first)' if args.drop_caches else ' (may come from the page cache)'}")
    print(f"greedy tokens equal on {sum(same)} of {len(same)} rounds")


if __name__ == "__main__":
    main()
