#!/usr/bin/env bash
# GRPO on GPUs with verl 0.9.1's Megatron workers (V1 trainer, vLLM rollout) and Conduit's trainer mode,
# the token-level experience in Conduit's TransferQueue backend.
#   TP=2 PP=2 bash recipes/verl_grpo_megatron.sh MODEL_PATH TRAIN_PARQUET VAL_PARQUET [extra hydra overrides...]
# Needs: pip install -e ".[verl]" (registers the verl.plugins entry point), vLLM and Megatron-LM (mcore).
# TP / PP / CP: the actor's tensor / pipeline / context parallel sizes (data-parallel ranks = GPUs / (TP*PP*CP);
#   Conduit's pieces split over those ranks; the TP/PP/CP peers of one rank read the same samples).
# MODE=sync gives verl's own trainer; BATCH, MINI, LOGGER, PIECE_GROUPS override the defaults.
# TQ_BACKEND: Conduit (default) or SimpleStorage; Conduit only: TQ_PLACEMENT="old_log_probs=pinned,..." puts
#   fields on tiers (shm default, host, disk, pinned, cuda); TQ_BUDGETS="shm=8000000000" caps a tier's bytes.
set -euo pipefail
MODEL=${1:?model path}; TRAIN=${2:?train parquet}; VAL=${3:?val parquet}; shift 3
source "$(dirname "${BASH_SOURCE[0]}")/verl_common.sh"  # NGPU, TQ_* checked; DATA, ACTOR, TRAINER
: "${TP:=2}" "${PP:=1}" "${CP:=1}"
if (( NGPU % (TP * PP * CP) )); then
  echo "NGPU=$NGPU is not a multiple of TP*PP*CP=$((TP * PP * CP))" >&2; exit 2
fi
MG=(
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$TP"
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$PP"
  actor_rollout_ref.actor.megatron.context_parallel_size="$CP"
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size="$TP"
  actor_rollout_ref.ref.megatron.pipeline_model_parallel_size="$PP"
  actor_rollout_ref.ref.megatron.context_parallel_size="$CP"
)
python -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \
  algorithm.adv_estimator=grpo \
  "${DATA[@]}" \
  "${MG[@]}" \
  "${ACTOR[@]}" \
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  "${TRAINER[@]}" \
  "$@"
