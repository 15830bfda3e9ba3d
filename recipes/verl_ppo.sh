#!/usr/bin/env bash
# PPO (GAE with a critic) on GPUs with verl 0.9.1 (V1 trainer, vLLM rollout, FSDP workers), Conduit mode.
#   bash recipes/verl_ppo.sh MODEL_PATH TRAIN_PARQUET VAL_PARQUET [extra hydra overrides...]
# Needs: pip install -e ".[verl]" (registers the verl.plugins entry point) and vLLM.
# MODE=sync gives verl's own trainer; BATCH, MINI, LOGGER (e.g. console,file), PIECE_GROUPS (prompt
# groups per ingestion piece, default auto) override defaults.
# TQ_BACKEND: TransferQueue's storage (where verl keeps the experience): Conduit (default: Conduit's
#   backend) or SimpleStorage (verl's own; e.g. with MODE=sync for verl as shipped). Conduit only:
#   TQ_PLACEMENT="old_log_probs=pinned,ref_log_prob=host" puts fields on tiers (shm default, host, disk,
#   pinned, cuda); TQ_BUDGETS="shm=8000000000,pinned=2000000000" caps a tier's bytes (a field that
#   does not fit spills to the next tier).
set -euo pipefail
MODEL=${1:?model path}; TRAIN=${2:?train parquet}; VAL=${3:?val parquet}; shift 3
source "$(dirname "${BASH_SOURCE[0]}")/verl_common.sh"  # NGPU, TQ_* checked; DATA, ACTOR, TRAINER
python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=gae \
  "${DATA[@]}" \
  actor_rollout_ref.actor.strategy=fsdp2 \
  "${ACTOR[@]}" \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  critic.enable=True critic.strategy=fsdp2 critic.model.path="$MODEL" \
  critic.optim.lr=1e-5 critic.ppo_micro_batch_size_per_gpu=8 critic.forward_micro_batch_size_per_gpu=8 \
  "${TRAINER[@]}" \
  "$@"
