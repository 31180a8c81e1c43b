#!/usr/bin/env bash
# Decode speed, peak memory and disk reads of Red Lite and llama.cpp on one
# GGUF, with memory capped by a cgroup v1 memory controller (page cache
# counts against the cap) and uncapped. Needs root and /sys/fs/cgroup/memory.
#
#   bench/capped.sh MODEL.gguf LLAMA_BIN_DIR
#
# Environment (all optional):
#   REDLITE=target/release/redlite   the redlite binary
#   CAPS="8 0"      caps in GiB, 0 = uncapped (the machine's RAM)
#   N_GEN=4         decode tokens timed under a cap
#   N_GEN_FREE=16   decode tokens timed uncapped
#   REPS=1          timed runs per engine (after the warm-up token; Red Lite's
#                   expert cache stays warm from one run to the next)
#   THREADS=nproc   threads for both engines
#   TIMEOUT=600     seconds per run; a run past it is stopped and recorded
#                   as partial (redlite prints every slow decode step)
#   ENGINES="redlite llama"   also: redlite-random (redlite with
#                   --mmap-advice random: no kernel read-ahead on faults)
#   LLAMA_ARGS      extra llama-bench args
#   REDLITE_ARGS    extra `redlite bench model` args (e.g. "--memory 8G")
#   LOG_DIR         raw outputs (default: a temp dir)
#
# Each run: the model file is dropped from the page cache
# (posix_fadvise DONTNEED) for capped runs, or read into it first for
# uncapped runs; a fresh cgroup (memory + blkio) is made with the cap; the
# engine is started inside it; afterwards the script reads the cgroup's
# memory.max_usage_in_bytes and memory.stat, the engine's peak RSS
# (ru_maxrss = VmHWM) and bytes read from disk (ru_inblock, the kernel's
# per-task read accounting, which counts page-fault reads of a mapped file).
#
# redlite: `bench model -p 0 -n N -d 0 -r 1` (one untimed warm-up token,
# then N timed steps); llama.cpp: `llama-bench -p 0 -n N -r 1` (same shape:
# one warm-up token, N timed).
set -euo pipefail
usage() { sed -n '2,30p' "$0"; exit 2; }
[[ $# -eq 2 ]] || usage
MODEL=$1
BIN=$2
REDLITE=${REDLITE:-target/release/redlite}
CAPS=${CAPS:-8 0}
N_GEN=${N_GEN:-4}
N_GEN_FREE=${N_GEN_FREE:-16}
REPS=${REPS:-1}
THREADS=${THREADS:-$(nproc)}
TIMEOUT=${TIMEOUT:-600}
ENGINES=${ENGINES:-redlite llama}
LOG_DIR=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG_DIR"
CG=/sys/fs/cgroup
[[ -f $MODEL ]] || { echo "no model file $MODEL" >&2; exit 2; }
[[ -d $CG/memory ]] || { echo "no cgroup v1 memory controller at $CG/memory" >&2; exit 2; }
read -r -a LLAMA_ARGS_A <<< "${LLAMA_ARGS:-}"
read -r -a REDLITE_ARGS_A <<< "${REDLITE_ARGS:-}"

# page cache control for one file
cache() { # drop|fill
  python3 - "$MODEL" "$1" <<'PY'
import os, sys
path, what = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY)
if what == "drop":
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
else:
    while os.read(fd, 1 << 24):
        pass
os.close(fd)
PY
}

# Run a command in a fresh cgroup with a memory limit; print one JSON line
# of measurements. args: name limit_bytes(0 = none) timeout cmd...
RUNNER=$(cat <<'PY'
import json, os, signal, sys, time
name, limit, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cmd = sys.argv[4:]
cg = "/sys/fs/cgroup"
dirs = {c: f"{cg}/{c}/{name}" for c in ("memory", "blkio")}
for c, d in dirs.items():
    if os.path.isdir(d):
        os.rmdir(d)
    if os.path.isdir(f"{cg}/{c}"):
        os.mkdir(d)
mem = dirs["memory"]
open(f"{mem}/memory.limit_in_bytes", "w").write(str(limit) if limit > 0 else "-1")
def stat(path):
    out = {}
    try:
        for line in open(path):
            k, v = line.split()[:2]
            out[k] = int(v)
    except OSError:
        pass
    return out
disk0 = open("/proc/diskstats").read()
t0 = time.time()
pid = os.fork()
if pid == 0:
    for c, d in dirs.items():
        if os.path.isdir(d):
            open(f"{d}/cgroup.procs", "w").write(str(os.getpid()))
    os.execvp(cmd[0], cmd)
status, ru, timed_out, hwm = None, None, False, 0
while True:
    p, st, r = os.wait4(pid, os.WNOHANG)
    if p == pid:
        status, ru = st, r
        break
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                hwm = max(hwm, int(line.split()[1]) * 1024)
    except OSError:
        pass
    if time.time() - t0 > timeout and not timed_out:
        timed_out = True
        os.kill(pid, signal.SIGINT)
        time.sleep(5)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.2)
wall = time.time() - t0
ms = stat(f"{mem}/memory.stat")
blk = 0
try:
    for line in open(f"{dirs['blkio']}/blkio.throttle.io_service_bytes"):
        f = line.split()
        if len(f) == 3 and f[1] == "Read":
            blk += int(f[2])
except OSError:
    pass
res = {
    "name": name,
    "cap_bytes": limit,
    "exit": os.waitstatus_to_exitcode(status),
    "timed_out": timed_out,
    "wall_s": round(wall, 1),
    "cgroup_max_usage": int(open(f"{mem}/memory.max_usage_in_bytes").read()),
    "cgroup_failcnt": int(open(f"{mem}/memory.failcnt").read()),
    "vmhwm": max(hwm, ru.ru_maxrss * 1024),
    "read_bytes": ru.ru_inblock * 512,
    "blkio_read_bytes": blk,
    "majfaults": ru.ru_majflt,
    "cgroup_pgmajfault": ms.get("total_pgmajfault", ms.get("pgmajfault")),
    "cgroup_cache_end": ms.get("total_cache", ms.get("cache")),
    "cgroup_rss_end": ms.get("total_rss", ms.get("rss")),
}
for c, d in dirs.items():
    try:
        os.rmdir(d)
    except OSError:
        pass
print(json.dumps(res))
PY
)

# tokens and tok/s from an engine's output: redlite JSON / llama-bench JSON,
# or, for a stopped run, redlite's per-step stderr lines.
speed() { # engine out err
  python3 - "$@" <<'PY'
import json, re, sys
engine, out, err = sys.argv[1:4]
try:
    d = json.load(open(out))
    o = [x for x in d if x.get("n_gen", 0) > 0][0]
    print(f'{o["n_gen"]} {o["avg_ts"]:.4f} complete')
    sys.exit()
except Exception:
    pass
steps = re.findall(r"decode step (\d+)/(\d+): ([\d.]+) s", open(err, errors="replace").read())
timed = [s for s in steps if not s[0].startswith("w")]
if timed:
    secs = sum(float(s[2]) for s in timed)
    print(f"{len(timed)} {len(timed) / secs:.4f} partial")
else:
    print("0 0 none")
PY
}

human() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**30:.2f} GiB')" "$1"; }

ROWS=()
for cap in $CAPS; do
  limit=$((cap << 30)); n=$N_GEN; label="${cap} GiB cap"
  if [[ $cap == 0 ]]; then limit=0; n=$N_GEN_FREE; label="uncapped ($(free -g | awk '/Mem:/{print $2}') GiB RAM)"; fi
  for eng in $ENGINES; do
    tag="$eng-cap$cap"
    if [[ $cap == 0 ]]; then cache fill; else cache drop; fi
    if [[ $eng == redlite* ]]; then
      cmd=("$REDLITE" bench model -m "$MODEL" -p 0 -n "$n" -d 0 -r "$REPS" -t "$THREADS" -o json)
      [[ $eng == redlite-random ]] && cmd+=(--mmap-advice random)
      cmd+=("${REDLITE_ARGS_A[@]}")
    else
      cmd=("$BIN/llama-bench" -m "$MODEL" -p 0 -n "$n" -r "$REPS" -t "$THREADS" -o json "${LLAMA_ARGS_A[@]}")
    fi
    echo "== $label, $eng: ${cmd[*]}" >&2
    m=$(python3 -c "$RUNNER" "redlite-cap-$tag" "$limit" "$TIMEOUT" "${cmd[@]}" \
        >"$LOG_DIR/$tag.json" 2>"$LOG_DIR/$tag.err"; tail -1 "$LOG_DIR/$tag.json")
    # the runner's line is last in stdout; the engine's JSON is before it
    head -n -1 "$LOG_DIR/$tag.json" >"$LOG_DIR/$tag.engine.json" || true
    echo "$m" >"$LOG_DIR/$tag.measure.json"
    read -r toks ts state <<< "$(speed "$eng" "$LOG_DIR/$tag.engine.json" "$LOG_DIR/$tag.err")"
    row=$(python3 - "$m" "$label" "$eng" "$toks" "$n" "$ts" "$state" <<'PY'
import json, sys
m = json.loads(sys.argv[1]); label, eng, toks, n, ts, state = sys.argv[2:8]
g = lambda b: f"{b / 2**30:.2f} GiB" if b is not None else "?"
name = {"redlite": "Red Lite", "redlite-random": "Red Lite, madvise(RANDOM)"}.get(eng, "llama.cpp")
done = f"{toks}/{n}" + ("" if state == "complete" else f" ({state}, stopped at {m['wall_s']:.0f} s)" if m["timed_out"] else f" ({state})")
print(f"| {label} | {name} | {float(ts):.3f} | {done} | {m['wall_s']:.0f} | {g(m['cgroup_max_usage'])} | {g(m['vmhwm'])} | {g(m['read_bytes'])} | {m['majfaults']} |")
PY
)
    echo "$row" >&2
    ROWS+=("$row")
  done
done

echo
echo "$(date -u +%F) | commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?') | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM | $(basename "$MODEL") $(human "$(stat -c %s "$MODEL")") | $THREADS threads | logs $LOG_DIR"
echo
echo "| memory | engine | decode tok/s | tokens | wall s (whole run) | cgroup peak (max_usage) | peak RSS (VmHWM) | read from disk | major faults |"
echo "|---|---|---:|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
