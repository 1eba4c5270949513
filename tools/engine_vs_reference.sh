#!/usr/bin/env bash
# The engine against the plain reference decoder, before and after a change (issue 49: b0f923c^ vs HEAD):
# each side from its own git worktree, ABBA over 5 rounds, paired Wilcoxon per budget. Run on an idle machine:
#   bash tools/engine_vs_reference.sh [AFTER_COMMIT]
# Engine vs the plain reference decoder (bench --reference: workbench/bench/plain_decoder.py compare_reference),
# the code before issue 49 against the code after it, alternated over 5 rounds on an idle machine, as
# docs/figures.md "The engine against a plain decoder" did for issue 43; then a paired Wilcoxon per budget on
# engine / reference tok/s (after vs before). Run from the repository root: bash engine_vs_reference.sh [AFTER]
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
PY="$ROOT/.venv/bin/python"
BEFORE=$(git -C "$ROOT" rev-parse b0f923c^)      # 37b16b5: the last commit before issue 49's first (b0f923c)
AFTER=$(git -C "$ROOT" rev-parse "${1:-HEAD}")
ROUNDS=5
W=$(mktemp -d /tmp/ab49.XXXX)
echo "before $BEFORE, after $AFTER, results in $W"
for side in before after; do
  rev=$BEFORE; [ "$side" = after ] && rev=$AFTER
  git -C "$ROOT" worktree add --detach "$W/$side" "$rev" >/dev/null
  # each side imports its own workbench (cwd first on sys.path) and its own kernels as ddtree_kernels
  mkdir -p "$W/$side-path" && ln -s "$W/$side/kernels" "$W/$side-path/ddtree_kernels"
  (cd "$W/$side" && PYTHONPATH="$W/$side-path" "$PY" -c \
    "import workbench, ddtree_kernels; print('$side:', workbench.__file__, ddtree_kernels.__file__)")
done
# long split, prompts 20-31 (0-based): the same shipped file in both trees
sed -n '21,32p' "$ROOT/workbench/assets/eval_prompts.jsonl" > "$W/long-20-31.jsonl"
run() {  # side round
  (cd "$W/$1" && OMP_NUM_THREADS=1 PYTHONPATH="$W/$1-path" "$PY" -m workbench bench --reference \
     --policies ddtree:16,ddtree:32,ddtree:64 --prompts "$W/long-20-31.jsonl" --max-new-tokens 64 \
     --repeats 1 --threads 1 --json > "$W/$1-$2.json")
  echo "round $2 $1 done ($(cut -d' ' -f1 /proc/loadavg) load)"
}
for r in $(seq 1 $ROUNDS); do  # ABBA: which side goes first alternates, so a drift in load hits both alike
  if [ $((r % 2)) -eq 1 ]; then run before "$r"; run after "$r"; else run after "$r"; run before "$r"; fi
done
"$PY" - "$W" "$ROUNDS" <<'EOF'
import json, statistics, sys
from scipy.stats import wilcoxon
w, rounds = sys.argv[1], int(sys.argv[2])
read = lambda side, r: json.load(open(f"{w}/{side}-{r}.json"))["reference"]
labels = list(read("before", 1))
print("engine / reference tok/s per round (same_trees must be True in every run)")
for label in labels:
    got = {side: [read(side, r)[label]["tokens_per_s_ratio"] for r in range(1, rounds + 1)] for side in ("before", "after")}
    same = all(read(side, r)[label]["same_trees"] for side in got for r in range(1, rounds + 1))
    p = wilcoxon(got["after"], got["before"]).pvalue
    slower = wilcoxon(got["after"], got["before"], alternative="less").pvalue
    print(f"{label:<12} before {' / '.join(f'{x:.2f}' for x in got['before'])} (median {statistics.median(got['before']):.2f})"
          f"  after {' / '.join(f'{x:.2f}' for x in got['after'])} (median {statistics.median(got['after']):.2f})"
          f"  Wilcoxon two-sided p = {p:.2f}, after slower p = {slower:.2f}, same trees {same}")
EOF
for side in before after; do git -C "$ROOT" worktree remove --force "$W/$side"; done
