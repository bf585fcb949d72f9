"""Prints the short table that ends scripts/gpu-test.sh from its ctest and bench logs."""
import re
import sys


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)


def main(ctest_log, bench_log):
    text = open(ctest_log, errors="replace").read()
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", text)
    skipped = len(re.findall(r"\*\*\*Skipped|Not Run", text))
    if m:
        total, failed = int(m.group(3)), int(m.group(2))
        print(f"ctest: {total - failed}/{total} passed, {failed} failed, {skipped} skipped")
    for name in re.findall(r"\d+ - (\S+) \(Failed\)", text):
        print(f"  FAILED {name}")
    ours, torch = {}, {}
    try:
        bench_lines = open(bench_log, errors="replace").readlines()
    except OSError:
        bench_lines = []
    for line in bench_lines:
        if line.startswith("BENCH "):
            name = line.split()[1]
            (torch if "torch_eager_ms" in line else ours).setdefault(name, {}).update(fields(line))
        elif line.startswith("BENCH-FAILED"):
            print(line.strip())
    if not ours and not torch:
        return
    print(f"{'step':18} {'meganeura ms':>12} {'torch eager':>12} {'torch graph':>12} "
          f"{'launch/step':>11} {'build cold':>10} {'warm':>8}")
    for name in sorted(set(ours) | set(torch)):
        o, t = ours.get(name, {}), torch.get(name, {})
        print(f"{name:18} {o.get('step_ms', '-'):>12} {t.get('torch_eager_ms', '-'):>12} "
              f"{t.get('torch_graph_ms', '-'):>12} {o.get('launches_per_step', '-'):>11} "
              f"{o.get('build_cold_ms', '-'):>10} {o.get('build_warm_ms', '-'):>8}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
