#!/bin/bash
# What srun runs on every node of slurm/train.sbatch: this node's torchrun agent, or with
# Z2ALL_SUPERVISE=1 monitor_process.py supervising it. Here, not in the batch script, because
# SLURM_NODEID and SLURMD_NODENAME differ per node (the batch script sees the first node's).
set -euo pipefail
PYTHON=${PYTHON:-python}
torchrun=("$PYTHON" -m torch.distributed.run
          --nnodes="$SLURM_NNODES" --node_rank="$SLURM_NODEID"
          --nproc_per_node="${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}"
          --rdzv_backend=c10d --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$SLURM_JOB_ID"
          train_my_ddp.py "$@")
if [ "${Z2ALL_SUPERVISE:-0}" = 1 ]; then
    # shellcheck disable=SC2086  # MONITOR_ARGS: words, split on purpose
    exec "$PYTHON" monitor_process.py --node_name="$SLURMD_NODENAME" ${MONITOR_ARGS:-} -- \
        "${torchrun[@]}"
fi
exec "${torchrun[@]}"
