#!/usr/bin/env bash
# GRPO on GPUs with verl 0.9.1 (V1 trainer, vLLM rollout, FSDP workers) and Conduit's trainer mode.
#   bash recipes/verl_grpo.sh MODEL_PATH TRAIN_PARQUET VAL_PARQUET [extra hydra overrides...]
# Needs: pip install -e ".[verl]" (registers the verl.plugins entry point) and vLLM.
# MODE=sync gives verl's own trainer for comparison; BATCH, MINI, LOGGER, G_ING (groups per ingestion piece, default auto) override the defaults.
# TQ_BACKEND: TransferQueue's storage (where verl keeps the experience): Conduit (default: Conduit's
#   backend) or SimpleStorage (verl's own; e.g. with MODE=sync for verl as shipped). Conduit only:
#   TQ_PLACEMENT="old_log_probs=pinned,ref_log_prob=host" puts fields on tiers (shm default, host, disk,
#   pinned, cuda); TQ_BUDGETS="shm=8000000000,pinned=2000000000" caps a tier's bytes (a field that
#   does not fit spills to the next tier).
set -euo pipefail
MODEL=${1:?model path}; TRAIN=${2:?train parquet}; VAL=${3:?val parquet}; shift 3
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
: "${TQ_BACKEND:=Conduit}" "${TQ_PLACEMENT:=}" "${TQ_BUDGETS:=}"
if [[ "$TQ_BACKEND" != Conduit && -n "$TQ_PLACEMENT$TQ_BUDGETS" ]]; then
  echo "TQ_PLACEMENT / TQ_BUDGETS need TQ_BACKEND=Conduit" >&2; exit 2
fi
TQ=(transfer_queue.backend.storage_backend="$TQ_BACKEND")
for kv in ${TQ_PLACEMENT//,/ }; do TQ+=("+transfer_queue.backend.Conduit.placement.$kv"); done
for kv in ${TQ_BUDGETS//,/ }; do TQ+=("+transfer_queue.backend.Conduit.budgets.$kv"); done
# one node: Ray, TransferQueue and Conduit's stores listen on 127.0.0.1 only (Ray otherwise replaces the
# node address by the routable one and listens on all interfaces; README "Sockets")
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=${RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER:-0}
python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="['$TRAIN']" data.val_files="['$VAL']" \
  data.train_batch_size=${BATCH:-256} data.max_prompt_length=512 data.max_response_length=1024 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=${MINI:-64} \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  trainer.v1.trainer_mode=${MODE:-conduit} \
  "${TQ[@]}" \
  +trainer.v1.conduit.g_ing=${G_ING:-auto} \
  trainer.n_gpus_per_node="$NGPU" trainer.nnodes=1 \
  trainer.logger="[${LOGGER:-console}]" trainer.total_epochs=1 \
  "$@"
