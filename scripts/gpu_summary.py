"""Prints the short table that ends scripts/gpu-test.sh from its ctest and bench logs."""
import re
import sys


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)


def main(ctest_log, bench_log):
    text = open(ctest_log, errors="replace").read()
    # "100% tests passed out of 47" or "97% tests passed, 1 tests failed out of 47"
    m = re.search(r"\d+% tests passed(?:, (\d+) tests failed)? out of (\d+)", text)
    skipped = len(re.findall(r"\*\*\*Skipped|Not Run", text))
    if m:
        total, failed = int(m.group(2)), int(m.group(1) or 0)
        print(f"ctest: {total - failed}/{total} passed, {failed} failed, {skipped} skipped")
    for name in re.findall(r"\d+ - (\S+) \(Failed\)", text):
        print(f"  FAILED {name}")
    ours, torch = {}, {}
    try:
        bench_lines = open(bench_log, errors="replace").readlines()
    except OSError:
        bench_lines = []
    lm = {}
    for line in bench_lines:
        if line.startswith(("BENCH lm_", "BENCH torch_lm_", "BENCH torch_nanogpt_")):
            lm[line.split()[1]] = fields(line)
        elif line.startswith("BENCH "):
            name = line.split()[1]
            (torch if "torch_eager_ms" in line else ours).setdefault(name, {}).update(fields(line))
        elif line.startswith("BENCH-FAILED") or line.startswith("HF-PARITY"):
            print(line.strip())
    lm_table(lm)
    bar_table(lm)
    if not ours and not torch:
        return
    # "_noopt" rows (the optimizer off) go in their own columns beside the optimized row.
    off = {k[:-len("_noopt")]: v for k, v in ours.items() if k.endswith("_noopt")}
    print(f"{'step':18} {'meganeura ms':>12} {'opt off ms':>10} {'dispatches':>11} "
          f"{'torch eager':>12} {'torch graph':>12} {'build cold':>10} {'warm':>8}")
    for name in sorted((set(ours) | set(torch)) - {k + "_noopt" for k in off}):
        o, t, f = ours.get(name, {}), torch.get(name, {}), off.get(name, {})
        disp = f"{f.get('dispatches', '-')}->{o.get('dispatches', '-')}"
        print(f"{name:18} {o.get('step_ms', '-'):>12} {f.get('step_ms', '-'):>10} {disp:>11} "
              f"{t.get('torch_eager_ms', '-'):>12} {t.get('torch_graph_ms', '-'):>12} "
              f"{o.get('build_cold_ms', '-'):>10} {o.get('build_warm_ms', '-'):>8}")


def lm_table(lm):
    """Language-model steps: ours and transformers' in PyTorch, ms per step and device MiB."""
    rows = sorted(k[3:] for k in lm if k.startswith("lm_") and not k.endswith("_noopt"))
    if not rows:
        return
    print(f"{'model step':14} {'meganeura ms':>12} {'MiB':>6} {'opt off ms':>10} "
          f"{'dispatches':>11} {'torch eager':>11} {'MiB':>6} {'torch.compile':>13} {'MiB':>6}")
    for row in rows:
        o = lm.get("lm_" + row, {})
        f = lm.get(f"lm_{row}_noopt", {})
        e = lm.get(f"torch_lm_{row}_eager", {})
        c = lm.get(f"torch_lm_{row}_compile", {})
        disp = f"{f.get('dispatches', '-')}->{o.get('dispatches', '-')}"
        print(f"{row:14} {o.get('step_ms', '-'):>12} {o.get('device_mib', '-'):>6} "
              f"{f.get('step_ms', '-'):>10} {disp:>11} "
              f"{e.get('step_ms', '-'):>11} {e.get('peak_mib', '-'):>6} "
              f"{c.get('step_ms', '-'):>13} {c.get('peak_mib', '-'):>6}")


def bar_table(lm):
    """The PyTorch bar (benchmarks/torch_nanogpt.py): ms per step and peak MiB per model,
    precision and mode."""
    rows = sorted(k[len("torch_nanogpt_"):] for k in lm if k.startswith("torch_nanogpt_"))
    if not rows:
        return
    print(f"{'nanoGPT-style PyTorch':28} {'ms':>9} {'MiB':>7}")
    for row in rows:
        r = lm["torch_nanogpt_" + row]
        print(f"{row:28} {r.get('step_ms', '-'):>9} {r.get('peak_mib', '-'):>7}")
    # meganeura's rows beside the bar of the same model and precision (tf32 and bf16): the
    # ratios the issues ask about, step time and device memory against each peak.
    print(f"{'vs the bar':22} {'meganeura ms':>12} {'MiB':>6} {'eager ms':>9} {'MiB':>6} "
          f"{'x eager':>7} {'compile ms':>10} {'MiB':>6} {'x compile':>9}")
    for key in sorted(k for k in lm if k.startswith("lm_") and not k.endswith("_noopt")):
        row = key[3:]
        e = lm.get(f"torch_nanogpt_{row.replace('_logits', '')}_eager")
        c = lm.get(f"torch_nanogpt_{row.replace('_logits', '')}_compile")
        if not e and not c:
            continue
        o = lm[key]
        def ratio(t):
            try:
                return f"{float(o['step_ms']) / float(t['step_ms']):.2f}"
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                return "-"
        e, c = e or {}, c or {}
        print(f"{row:22} {o.get('step_ms', '-'):>12} {o.get('device_mib', '-'):>6} "
              f"{e.get('step_ms', '-'):>9} {e.get('peak_mib', '-'):>6} {ratio(e):>7} "
              f"{c.get('step_ms', '-'):>10} {c.get('peak_mib', '-'):>6} {ratio(c):>9}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
