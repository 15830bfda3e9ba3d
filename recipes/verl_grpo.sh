#!/usr/bin/env bash
# GRPO on GPUs with verl 0.9.1 (V1 trainer, vLLM rollout, FSDP workers) and Conduit's trainer mode.
#   bash recipes/verl_grpo.sh MODEL_PATH TRAIN_PARQUET VAL_PARQUET [extra hydra overrides...]
# Needs: pip install -e ".[verl]" (registers the verl.plugins entry point) and vLLM.
# MODE=sync gives verl's own trainer for comparison; BATCH, MINI, LOGGER, PIECE_GROUPS (prompt groups per ingestion piece, default auto) override the defaults.
# TQ_BACKEND: TransferQueue's storage (where verl keeps the experience): Conduit (default: Conduit's
#   backend) or SimpleStorage (verl's own; e.g. with MODE=sync for verl as shipped). Conduit only:
#   TQ_PLACEMENT="old_log_probs=pinned,ref_log_prob=host" puts fields on tiers (shm default, host, disk,
#   pinned, cuda); TQ_BUDGETS="shm=8000000000,pinned=2000000000" caps a tier's bytes (a field that
#   does not fit spills to the next tier).
set -euo pipefail
MODEL=${1:?model path}; TRAIN=${2:?train parquet}; VAL=${3:?val parquet}; shift 3
source "$(dirname "${BASH_SOURCE[0]}")/verl_common.sh"  # NGPU, TQ_* checked; DATA, ACTOR, TRAINER
# one node: Ray, TransferQueue and Conduit's stores listen on 127.0.0.1 only (Ray otherwise replaces the
# node address by the routable one and listens on all interfaces; README "Sockets")
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=${RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER:-0}
python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  "${DATA[@]}" \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 \
  "${ACTOR[@]}" \
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  "${TRAINER[@]}" \
  "$@"
