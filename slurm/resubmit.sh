#!/bin/bash
# resubmit.sh -- submit the remainder of a checkpointed run, on another number of nodes or tasks.
#
# Usage:
#   resubmit.sh [options] --job JOBID                  reuse that job's script and arguments
#   resubmit.sh [options] [--] SCRIPT [ARGS...]        or give them again
#
# The application restarts from the newest valid checkpoint under its root by itself
# (hpcckpt.Checkpointer.latest/restore), and hpcckpt reshards a checkpoint on load, so
# "the remainder" is simply the same command on the new shape.  This helper makes that safe:
#   * with --job, it reads the earlier job's batch script and arguments, working directory,
#     output file and name (scontrol show job); the new job appends to the same log;
#   * if the earlier job is still pending (for instance requeued), it cancels it, so that only
#     one job writes the checkpoint root; if it is still running, the new job is made to wait
#     for its end (--dependency=afterany:JOBID);
#   * it reports the newest committed checkpoint under the root (--root DIR, or the value
#     after --root in the application's arguments) and refuses when there is none
#     (--allow-empty starts from scratch instead).
#
# Options:
#   -j, --job JOBID          the earlier job
#   -N, --nodes N            nodes of the new job
#   -n, --ntasks N           tasks (MPI ranks) of the new job
#   --ntasks-per-node N
#   -t, --time LIMIT
#   --root DIR               checkpoint root to report on
#   --allow-empty            submit even when the root holds no checkpoint
#   --dry-run                print the sbatch command, submit nothing
#   --sbatch-opt=OPTION      one more sbatch option, verbatim (repeatable), e.g. --sbatch-opt=--qos=low
# Environment: HPCCKPT_PYTHON (python3) to read the checkpoint root; the HPCCKPT_* settings of
# slurm/hpcckpt.sbatch pass through sbatch to the new job.
#
# Prints what it did and sbatch's "Submitted batch job N"; exit status 0 on success.

set -u
me=resubmit
PY=${HPCCKPT_PYTHON:-python3}
usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
die() { echo "$me: $*" >&2; exit 1; }

job= root= allow_empty=0 dry=0
opts=()
while [ $# -gt 0 ]; do
    case $1 in
        -j|--job) job=$2; shift 2 ;;
        -N|--nodes) opts+=(--nodes="$2"); shift 2 ;;
        -n|--ntasks) opts+=(--ntasks="$2"); shift 2 ;;
        --ntasks-per-node) opts+=(--ntasks-per-node="$2"); shift 2 ;;
        -t|--time) opts+=(--time="$2"); shift 2 ;;
        --root) root=$2; shift 2 ;;
        --allow-empty) allow_empty=1; shift ;;
        --dry-run) dry=1; shift ;;
        --sbatch-opt=*) opts+=("${1#--sbatch-opt=}"); shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) echo "$me: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done

# One field of `scontrol show job` (values may contain spaces only for Command=, the last on its line).
field() { sed -n "s/.*[[:space:]]$1=\\([^[:space:]]*\\).*/\\1/p; s/^$1=\\([^[:space:]]*\\).*/\\1/p" <<<"$info" | head -n1; }

cmd=("$@")
if [ -n "$job" ]; then
    info=$(scontrol show job "$job" 2>&1) || die "scontrol show job $job: $info"
    state=$(field JobState)
    if [ ${#cmd[@]} -eq 0 ]; then
        # Command= is the script and its arguments, separated by single spaces (no quoting survives)
        line=$(sed -n 's/^ *Command=//p' <<<"$info" | head -n1)
        [ -n "$line" ] || die "job $job has no batch script (Command=) to reuse; give SCRIPT ARGS"
        read -ra cmd <<<"$line"
        workdir=$(field WorkDir)
        stdout=$(field StdOut)
        name=$(field JobName)
        [ -n "$workdir" ] && opts=(--chdir="$workdir" "${opts[@]}")
        [ -n "$stdout" ] && opts=(--output="$stdout" "${opts[@]}")
        [ -n "$name" ] && opts=(--job-name="$name" "${opts[@]}")
    fi
    case $state in
        PENDING|REQUEUED|REQUEUE_HOLD|REQUEUE_FED|SUSPENDED)
            echo "$me: job $job is $state: cancelling it so that only the new job writes the checkpoint"
            if [ "$dry" -eq 0 ]; then
                # scancel retries by itself while slurmctld says "try again later" (a job just requeued)
                scancel "$job" || die "scancel $job failed"
                gone=0
                for _ in $(seq 1 120); do
                    info=$(scontrol show job "$job" 2>/dev/null) || { gone=1; break; }
                    case $(field JobState) in
                        PENDING|REQUEUED|REQUEUE_HOLD|REQUEUE_FED|SUSPENDED|COMPLETING|RUNNING|CONFIGURING) sleep 0.5 ;;
                        *) gone=1; break ;;
                    esac
                done
                [ "$gone" -eq 1 ] || die "job $job is still $(field JobState) after scancel; not submitting a second writer"
                echo "$me: job $job is $(field JobState)"
            fi ;;
        RUNNING|COMPLETING|CONFIGURING|RESIZING|SIGNALING|STAGE_OUT)
            echo "$me: job $job is $state: the new job will start after it ends"
            opts+=(--dependency=afterany:"$job") ;;
        *) echo "$me: job $job is $state" ;;
    esac
fi
[ ${#cmd[@]} -gt 0 ] || usage

# The checkpoint root: --root, else the application's own --root argument.
if [ -z "$root" ]; then
    for ((i = 0; i < ${#cmd[@]}; i++)); do
        case ${cmd[$i]} in
            --root) root=${cmd[$((i + 1))]:-} ;;
            --root=*) root=${cmd[$i]#--root=} ;;
        esac
    done
    if [ -n "$root" ] && [ "${root#/}" = "$root" ] && [ -n "${workdir:-}" ]; then
        root=$workdir/$root   # relative to the job's working directory
    fi
fi
if [ -n "$root" ]; then
    latest=$("$PY" -c 'import sys
from hpcckpt.root.catalog import current, list_versions
v = current(list_versions(sys.argv[1]))
print(f"{v[-1].step} {v[-1].path}" if v else "")' "$root") || die "cannot read the checkpoint root $root with $PY"
    if [ -n "$latest" ]; then
        echo "$me: newest checkpoint under $root: step ${latest%% *} (${latest#* })"
    elif [ "$allow_empty" -eq 1 ]; then
        echo "$me: no checkpoint under $root: the new job starts from scratch"
    else
        die "no committed checkpoint under $root (use --allow-empty to start from scratch)"
    fi
fi

sb=(sbatch "${opts[@]}" "${cmd[@]}")
echo "$me: ${sb[*]}"
[ "$dry" -eq 1 ] && exit 0
exec "${sb[@]}"
