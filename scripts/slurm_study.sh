#!/usr/bin/env bash
# A study plan on a SLURM cluster: one or more 8-GPU nodes, preemptible (README: "Reproducing the paper").
#
#   sbatch scripts/slurm_study.sh                      # the paper's plan on one node
#   sbatch --nodes=2 scripts/slurm_study.sh            # each run on 2 nodes (16 GPUs, the same pairs)
#   PLAN=cpu STUDY_ARGS="--extra=--device=cuda" sbatch scripts/slurm_study.sh
#
# What happens on preemption or at the time limit: SLURM sends SIGUSR1 to every process of the job step
# (--signal, 10 minutes before the limit) or SIGTERM (preemption). torchrun passes it to its workers,
# every rank stops at its next log step and rank 0 writes a checkpoint; study.py on each node then exits
# with 75, and this script requeues the job (--requeue). The requeued job runs this script from the
# top: study.py skips the finished runs and continues the interrupted one from its checkpoint.
# The lead time a stop needs: up to one log_interval of steps, then the checkpoint's save (predicted under 30 s
# at 343m; scripts/gpu_check.py measures it as preemption_lead_s, docs/gpus.md): USR1@600 and torchrun's
# --shutdown_timeout=300 below leave room for it many times over.
#
#SBATCH --job-name=rd-attnres-study
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -uo pipefail

PLAN="${PLAN:-paper}"
STUDY_ARGS="${STUDY_ARGS:-}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
PORT="${PORT:-29500}"
# the repository: sbatch runs a copy of this script from a spool folder, so it is where sbatch was called
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}" || exit 1

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# One torchrun per node and run; the nodes meet at the head node's c10d rendezvous, a new one per run
# ({index} is the run's number in the plan). torchrun handles SIGUSR1 too (by default it would die of
# it) and gives the workers 5 minutes to write their checkpoint before it kills them.
launcher="torchrun --nnodes=${SLURM_NNODES:-1} --nproc_per_node=$GPUS_PER_NODE --rdzv_backend=c10d"
launcher+=" --rdzv_endpoint=$head_node:$PORT --rdzv_id=${SLURM_JOB_ID}_{index}"
launcher+=" --signals_to_handle=SIGTERM,SIGINT,SIGUSR1 --shutdown_timeout=300"

echo "$(date -Is) job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_NNODES:-1} node(s), head $head_node: plan $PLAN"
# srun starts study.py once per node; only node 0 writes the report at the end.
# shellcheck disable=SC2086
srun --kill-on-bad-exit=0 bash -c 'exec python study.py run "$0" --launcher="$1" $( [ "$SLURM_NODEID" = 0 ] || echo --no_report ) $2' \
    "$PLAN" "$launcher" "$STUDY_ARGS" &
step=$!
# a signal to this shell (e.g. scancel --batch) is passed on to the job step; wait again for its end
trap 'kill -TERM $step 2>/dev/null' TERM USR1
wait $step
code=$?
while kill -0 $step 2>/dev/null; do wait $step; code=$?; done

if [ "$code" -eq 75 ]; then
    echo "$(date -Is) the study stopped on a signal with its checkpoints written: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
echo "$(date -Is) study.py exited with $code"
exit "$code"
