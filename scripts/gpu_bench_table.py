"""The Markdown table of scripts/gpu-bench.sh's results.

usage: python3 scripts/gpu_bench_table.py OUT PRESET... [--families NAME...]
       python3 scripts/gpu_bench_table.py --pairs OUT PRESET...

Reads OUT/bandwidth.json, OUT/PRESET.json (ondo bench --peer mlx-lm --json)
and OUT/PRESET.graph.txt (one decode step's graph as MLX prints it), and
prints one table for all presets: decode and prefill against mlx-lm, decode
as a share of the bandwidth roofline (every weight read once per token), the
decode step's anatomy, and the token check. After --families, each NAME's
OUT/NAME.json (a family's synthetic folder at one shape) makes a row of a
second table: its decode and prefill against mlx-lm and its token check's
verdict.
"""

import collections
import json
import sys
from pathlib import Path


def first_graph(path):
    """The primitives of the first graph in MLX's dump, by name."""
    if not path.exists():
        return None
    ops = collections.Counter()
    seen_outputs = False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Inputs:"):
            if seen_outputs:
                break
            continue
        if line.startswith("Outputs:"):
            seen_outputs = True
            continue
        if seen_outputs and line.strip():
            ops[line.split()[0]] += 1
    return ops if seen_outputs else None


def read_result(path):
    """OUT/NAME.json as ondo bench wrote it, or None where it wrote none (a
    run that failed leaves the file empty)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fmt(summary, digits=1):
    return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}–{summary['max']:.{digits}f})"


def token_line(result):
    check = result["token_check"]
    verdict = result["token_verdict"]
    if verdict == "identical":
        return f"identical in all {check['rounds']} measured runs"
    parts = []
    for d in check["departures"]:
        if d["reference_departs_at"] is None:
            part = (f"prompt {d['prompt_tokens']} rep {d['repetition']}: mlx-lm repeated itself, "
                    f"Ondo departs at token {d['ondo_departs_at']}")
        else:
            part = (f"prompt {d['prompt_tokens']} rep {d['repetition']}: mlx-lm's own two runs "
                    f"part at token {d['reference_departs_at']}, Ondo's from its first at "
                    f"{d['ondo_departs_at']}")
        # mlx-lm's float32 gap between its token and Ondo's, in roundings
        # of its own dtype (bench::token_check; negative: float32 prefers
        # Ondo's), and for routed experts the expert choice nearest to a tie
        # on the way, in roundings of its layer's router scores.
        score = d.get("score")
        if score and score["rounding"] > 0:
            part += f" (gap {score['gap_f32'] / score['rounding']:+.2f} roundings"
            routing = score.get("routing")
            if routing and routing["rounding"] > 0:
                part += (f"; expert choice at layer {routing['layer']}, position "
                         f"{routing['position']}: {routing['margin_f32'] / routing['rounding']:.2f} "
                         "roundings from a tie")
            if score.get("explained_by"):
                part += f"; explained by the {score['explained_by']}"
            part += ")"
        parts.append(part)
    return f"{verdict.replace('_', ' ')} in {len(check['departures'])} of {check['rounds']} runs: " + "; ".join(parts)


def pairs_table(out, presets):
    """Every before/after pair's Ondo-to-mlx-lm ratios, and their medians."""
    import statistics
    pair_dirs = sorted(out.glob("pair-*"), key=lambda p: int(p.name.split("-")[1]))
    print(f"{len(pair_dirs)} pairs, the order alternating; ratios are Ondo / mlx-lm in the same run\n")
    print("| model | prompt | loop | measure | before, per pair | after, per pair | median before | median after |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in presets:
        rows = collections.defaultdict(lambda: {"before": [], "after": []})
        for pair in pair_dirs:
            for side in ("before", "after"):
                path = pair / side / f"{preset}.json"
                if not path.exists():
                    continue
                r = json.loads(path.read_text())
                for s in r["results"]:
                    if s["side"] == "mlx-lm":
                        continue
                    ref = next(x for x in r["results"] if x["side"] == "mlx-lm"
                               and x["prompt_tokens"] == s["prompt_tokens"])
                    key = (s["prompt_tokens"], s["side"].removeprefix("ondo "))
                    rows[key + ("decode vs mlx-lm",)][side].append(
                        s["decode_tps"]["median"] / ref["decode_tps"]["median"])
                    rows[key + ("prefill vs mlx-lm",)][side].append(
                        s["prompt_tps"]["median"] / ref["prompt_tps"]["median"])
                    a = s.get("anatomy") or {}
                    if a.get("host_build_ms"):
                        rows[key + ("host build ms/step",)][side].append(a["host_build_ms"]["median"])
        for (prompt, loop, measure), sides in sorted(rows.items()):
            cells = [", ".join(f"{v:.2f}" for v in sides[s]) or "—" for s in ("before", "after")]
            medians = [f"{statistics.median(sides[s]):.2f}" if sides[s] else "—" for s in ("before", "after")]
            print(f"| {preset} | {prompt} | {loop} | {measure} | {cells[0]} | {cells[1]} | {medians[0]} | {medians[1]} |")


def machine_line(r, bandwidth):
    e = r["environment"]
    return (f"Machine: {e['cpu']} · {e['os']} · MLX {e['mlx_version']} ({e['backend']}) · "
            f"mlx-lm {e['mlx_lm_version']} · Ondo {e['ondo_version']} ({e['build_profile']}) · "
            f"memory bandwidth measured {bandwidth / 1e9:.0f} GB/s · generate "
            f"{r['plan']['generate_tokens']} tokens, median (min–max) of "
            f"{r['plan']['repetitions']} after {r['plan']['warmup']} warm-up\n")


def family_table(out, names):
    """One row per family's comparison: Ondo's decode and prefill against
    mlx-lm's (each Ondo loop the run measured), and the token check."""
    lines = ["| family | model | prompt | side | decode tok/s | vs mlx-lm | prompt tok/s "
             "| vs mlx-lm | tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name in names:
        r = read_result(out / f"{name}.json")
        if r is None:
            lines.append(f"| {name} | — | — | — | — | — | — | — | no result: the run failed |")
            notes.append(f"- {name}: no result (its log: {name}.log)")
            continue
        e = r["environment"]
        label = f"{e['model_type']} ({e['quantization']}, {e['weights_bytes'] / 2**30:.2f} GiB)"
        verdict = r["token_verdict"].replace("_", " ")
        for s in r["results"]:
            if s["side"] == "mlx-lm":
                continue
            ref = next(x for x in r["results"] if x["side"] == "mlx-lm"
                       and x["prompt_tokens"] == s["prompt_tokens"])
            vs = lambda k: f"{s[k]['median'] / ref[k]['median']:.2f}x"
            lines.append("| " + " | ".join([
                name, label, str(s["prompt_tokens"]), s["side"],
                fmt(s["decode_tps"]), vs("decode_tps"), fmt(s["prompt_tps"], 0), vs("prompt_tps"),
                verdict,
            ]) + " |")
        if r["token_verdict"] != "identical":
            notes.append(f"- {name}: tokens {token_line(r)}")
    return lines, notes


def main():
    if sys.argv[1] == "--pairs":
        pairs_table(Path(sys.argv[2]), sys.argv[3:])
        return
    out = Path(sys.argv[1])
    args = sys.argv[2:]
    families = []
    if "--families" in args:
        at = args.index("--families")
        args, families = args[:at], args[at + 1:]
    presets = args
    bandwidth = json.loads((out / "bandwidth.json").read_text())["bytes_per_s"]
    lines = []
    header_done = False
    notes = []
    for preset in presets:
        r = read_result(out / f"{preset}.json")
        if r is None:
            notes.append(f"- {preset}: no result (the run failed: {preset}.graph.txt)")
            continue
        e = r["environment"]
        if not header_done:
            lines.append(machine_line(r, bandwidth))
            lines.append("| model | prompt | side | decode tok/s | vs mlx-lm | of roofline | prompt tok/s "
                         "| vs mlx-lm | peak MiB | build ms/step | wait ms/step | nodes/step | scalars/step |")
            lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            header_done = True
        roofline = bandwidth / e["weights_bytes"]
        label = f"{preset} ({e['quantization']}, {e['weights_bytes'] / 2**30:.2f} GiB)"
        for s in r["results"]:
            ref = next(x for x in r["results"] if x["side"] == "mlx-lm"
                       and x["prompt_tokens"] == s["prompt_tokens"])
            mine = s["side"] != "mlx-lm"
            vs = lambda k: f"{s[k]['median'] / ref[k]['median']:.2f}x" if mine else "—"
            a = s.get("anatomy") or {}
            cell = lambda k: f"{a[k]['median']:.3f}" if a.get(k) else "—"
            lines.append("| " + " | ".join([
                label, str(s["prompt_tokens"]), s["side"],
                fmt(s["decode_tps"]), vs("decode_tps"),
                f"{100 * s['decode_tps']['median'] / roofline:.0f}%",
                fmt(s["prompt_tps"], 0), vs("prompt_tps"),
                f"{s['mlx_peak_bytes']['median'] / 2**20:.0f}",
                cell("host_build_ms"), cell("wait_ms"),
                str(a.get("graph_nodes") or "—"), str(a.get("scalar_inputs") if a else "—"),
            ]) + " |")
        notes.append(f"- {preset}: tokens {token_line(r)}; roofline {roofline:.0f} tok/s")
        ops = first_graph(out / f"{preset}.graph.txt")
        if ops:
            top = ", ".join(f"{name} {count}" for name, count in ops.most_common(12))
            notes.append(f"  one decode step ({sum(ops.values())} primitives): {top}")
    if presets:
        print("\n".join(lines))
        print()
        print("\n".join(notes))
        print()
    if families:
        family_lines, family_notes = family_table(out, families)
        first = next((r for n in families if (r := read_result(out / f"{n}.json"))), None)
        if not header_done and first:
            print(machine_line(first, bandwidth))
        print("Each family's synthetic folder at one shape, Ondo against mlx-lm with the token check:\n")
        print("\n".join(family_lines))
        if family_notes:
            print()
            print("\n".join(family_notes))


if __name__ == "__main__":
    main()
