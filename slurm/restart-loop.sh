#!/bin/bash
# restart-loop.sh -- run an MPI program as a job step, and rerun it inside the same allocation
# after a failure (the idea of SCR's scr_srun_loop), excluding nodes that went down, until it
# succeeds, the restart budget is spent, or too little time is left before the job's end.
#
# Usage (inside an allocation: an sbatch script, or salloc):
#   restart-loop.sh [options] [--] PROGRAM [ARGS...]
#
# Options (each also an environment variable, the option wins):
#   --launcher srun|mpiexec  how to start the step            HPCCKPT_LAUNCHER      (srun)
#   --max-restarts N         reruns after a failed attempt    HPCCKPT_MAX_RESTARTS  (0)
#   --min-time SECONDS       do not start an attempt with     HPCCKPT_MIN_TIME      (120)
#                            less time than this left
#   --ntasks N               tasks of each attempt            HPCCKPT_NTASKS        (SLURM_NTASKS)
#   --delay SECONDS          pause before a rerun             HPCCKPT_RESTART_DELAY (5)
#   --probe                  before a rerun, also run `true` on each node with a 1-task step
#                            and exclude the nodes where it fails or hangs (30 s)
# More environment:
#   HPCCKPT_SRUN_ARGS     extra srun arguments (default: --mpi=pmi2)
#   HPCCKPT_MPIEXEC       the mpiexec to use (default: mpiexec on PATH)
#   HPCCKPT_MPIEXEC_ARGS  extra mpiexec arguments
#
# The program restarts itself from its newest valid checkpoint (hpcckpt.Checkpointer.latest and
# restore), so a rerun continues where the last checkpoint left off; when nodes are excluded
# the step gets fewer tasks (tasks per node times the healthy nodes, at most --ntasks) and
# hpcckpt reshards the checkpoint on load.
#
# SIGUSR1 / SIGTERM sent to this script are forwarded to the running step (srun and mpiexec
# pass them on to the ranks); the program is then expected to checkpoint and exit, and the
# loop does not rerun it.  Each attempt sees HPCCKPT_ATTEMPT (0, 1, ...) in its environment.
#
# Exit status: 0 when an attempt succeeded, else the last attempt's status
# (3 when no attempt could be started at all).

set -u
prog=restart-loop

launcher=${HPCCKPT_LAUNCHER:-srun}
max_restarts=${HPCCKPT_MAX_RESTARTS:-0}
min_time=${HPCCKPT_MIN_TIME:-120}
ntasks=${HPCCKPT_NTASKS:-${SLURM_NTASKS:-}}
delay=${HPCCKPT_RESTART_DELAY:-5}
probe=0

usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --launcher) launcher=$2; shift 2 ;;
        --max-restarts) max_restarts=$2; shift 2 ;;
        --min-time) min_time=$2; shift 2 ;;
        --ntasks) ntasks=$2; shift 2 ;;
        --delay) delay=$2; shift 2 ;;
        --probe) probe=1; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) echo "$prog: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || usage
case $launcher in srun|mpiexec) ;; *) echo "$prog: --launcher must be srun or mpiexec, not $launcher" >&2; exit 2 ;; esac
if [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "$prog: not inside a SLURM allocation (no SLURM_JOB_ID)" >&2
    exit 2
fi

log() { echo "$prog: $(date '+%F %T') $*"; }

# --- the allocation ------------------------------------------------------------------------
# All nodes of the job, one per line.
job_nodes() { scontrol show hostnames "${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}"; }

# The largest tasks-per-node count of the job: "2(x3),1" -> 2.
max_tasks_per_node() {
    local spec=${SLURM_TASKS_PER_NODE:-1} max=0 item n
    IFS=, read -ra items <<<"$spec"
    for item in "${items[@]}"; do
        n=${item%%(*}
        [ "$n" -gt "$max" ] 2>/dev/null && max=$n
    done
    echo $((max > 0 ? max : 1))
}

# Epoch seconds at which the job ends ("" when unlimited or unknown).
job_end() {
    if [ -n "${SLURM_JOB_END_TIME:-}" ] && [ "${SLURM_JOB_END_TIME}" -gt 0 ] 2>/dev/null; then
        echo "$SLURM_JOB_END_TIME"; return
    fi
    local e
    e=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null | head -n1)
    case $e in ''|N/A|Unknown|NONE) echo "" ;; *) date -d "$e" +%s 2>/dev/null || echo "" ;; esac
}

# Nodes of the job that SLURM reports down, drained, failing or not responding.
down_nodes() {
    sinfo -h -N -n "${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}" -t down,drain,fail,no_respond -o %N 2>/dev/null | sort -u
}

# Nodes where a trivial 1-task step fails or hangs.
probe_nodes() {
    local n
    for n in $(job_nodes); do
        timeout 30 srun --nodes=1 --ntasks=1 -w "$n" true >/dev/null 2>&1 || echo "$n"
    done
}

# --- signals -------------------------------------------------------------------------------
child=
stopping=0
forward() {
    stopping=1
    log "got SIG$1: forwarding it to the job step${child:+ (pid $child)}; no rerun after it ends"
    [ -n "$child" ] && kill -s "$1" "$child" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# --- the loop ------------------------------------------------------------------------------
excluded=""      # comma-separated nodes left out of the next attempts
attempt=0
rc=3
per_node=$(max_tasks_per_node)
while :; do
    end=$(job_end)
    if [ -n "$end" ] && [ $((end - $(date +%s))) -lt "$min_time" ]; then
        log "only $((end - $(date +%s))) s left (< --min-time $min_time): not starting attempt $attempt"
        break
    fi
    nodes=()
    for n in $(job_nodes); do
        case ",$excluded," in *",$n,"*) ;; *) nodes+=("$n") ;; esac
    done
    if [ ${#nodes[@]} -eq 0 ]; then
        log "no healthy node left (excluded: $excluded)"
        break
    fi
    n_tasks=${ntasks:-${#nodes[@]}}
    if [ -n "$excluded" ] && [ $((per_node * ${#nodes[@]})) -lt "$n_tasks" ]; then
        n_tasks=$((per_node * ${#nodes[@]}))
    fi
    hosts=$(IFS=,; echo "${nodes[*]}")
    if [ "$launcher" = srun ]; then
        # shellcheck disable=SC2086  # HPCCKPT_SRUN_ARGS is a list of words on purpose
        cmd=(srun ${HPCCKPT_SRUN_ARGS---mpi=pmi2} --kill-on-bad-exit=1 --ntasks="$n_tasks" --nodes="${#nodes[@]}")
        [ -n "$excluded" ] && cmd+=(--exclude="$excluded")
    else
        # shellcheck disable=SC2086
        cmd=("${HPCCKPT_MPIEXEC:-mpiexec}" -n "$n_tasks" ${HPCCKPT_MPIEXEC_ARGS:-})
        [ -n "$excluded" ] && cmd+=(-hosts "$hosts")
    fi
    cmd+=("$@")
    log "attempt $attempt: ${cmd[*]}  (nodes: $hosts; excluded: ${excluded:-none})"
    HPCCKPT_ATTEMPT=$attempt "${cmd[@]}" &
    child=$!
    # wait returns early (status > 128) whenever a trapped signal arrives; wait again until the step ends
    while :; do
        wait "$child"
        rc=$?
        kill -0 "$child" 2>/dev/null || break
    done
    child=
    log "attempt $attempt ended with exit status $rc"
    if [ "$rc" -eq 0 ]; then
        break
    fi
    if [ "$stopping" -eq 1 ]; then
        log "stopped by a signal: no rerun"
        break
    fi
    if [ "$attempt" -ge "$max_restarts" ]; then
        log "no restarts left (--max-restarts $max_restarts)"
        break
    fi
    attempt=$((attempt + 1))
    sleep "$delay"
    bad=$(down_nodes)
    [ "$probe" -eq 1 ] && bad=$(printf '%s\n%s\n' "$bad" "$(probe_nodes)")
    for n in $bad; do
        case ",$excluded," in *",$n,"*) ;; *) excluded=${excluded:+$excluded,}$n ;; esac
    done
    [ -n "$bad" ] && log "excluding nodes that went down: $(echo $bad)"
done
exit "$rc"
