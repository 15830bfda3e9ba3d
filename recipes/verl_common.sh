# What recipes/verl_grpo.sh, verl_ppo.sh and verl_grpo_megatron.sh share; they source it (it is not run by
# itself) after setting MODEL, TRAIN and VAL. It sets NGPU (default: the GPUs nvidia-smi lists), checks
# TransferQueue's storage settings (TQ_BACKEND, TQ_PLACEMENT, TQ_BUDGETS) and sets the arrays of
# verl.trainer.main_ppo overrides that every recipe passes:
#   DATA     data files, batch (BATCH), prompt and response lengths, the model path
#   ACTOR    the actor's learning rate and mini/micro batch sizes (MINI)
#   TRAINER  trainer mode (MODE), TransferQueue's storage, PIECE_GROUPS, this one node's GPUs, logger (LOGGER)
if [[ -n "${G_ING:-}" ]]; then  # renamed: verl's piece size is not the core's g_ing (fragments per call)
  echo "G_ING was renamed PIECE_GROUPS (prompt groups per streamed piece: an int, 0 or auto)" >&2; exit 2
fi
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
: "${TQ_BACKEND:=Conduit}" "${TQ_PLACEMENT:=}" "${TQ_BUDGETS:=}"
if [[ "$TQ_BACKEND" != Conduit && -n "$TQ_PLACEMENT$TQ_BUDGETS" ]]; then
  echo "TQ_PLACEMENT / TQ_BUDGETS need TQ_BACKEND=Conduit" >&2; exit 2
fi
TQ=(transfer_queue.backend.storage_backend="$TQ_BACKEND")
for kv in ${TQ_PLACEMENT//,/ }; do TQ+=("+transfer_queue.backend.Conduit.placement.$kv"); done
for kv in ${TQ_BUDGETS//,/ }; do TQ+=("+transfer_queue.backend.Conduit.budgets.$kv"); done
DATA=(
  data.train_files="['$TRAIN']" data.val_files="['$VAL']"
  data.train_batch_size=${BATCH:-256} data.max_prompt_length=512 data.max_response_length=1024
  actor_rollout_ref.model.path="$MODEL"
)
ACTOR=(
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=${MINI:-64}
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
)
TRAINER=(
  trainer.v1.trainer_mode=${MODE:-conduit}
  "${TQ[@]}"
  +trainer.v1.conduit.piece_groups=${PIECE_GROUPS:-auto}
  trainer.n_gpus_per_node="$NGPU" trainer.nnodes=1
  trainer.logger="[${LOGGER:-console}]" trainer.total_epochs=1
)
