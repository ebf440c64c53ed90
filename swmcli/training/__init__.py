"""Training, under the commands: what a run trains (``recipe``: the model, seeded, its parts
frozen and its memory ``techniques`` on: activation checkpointing, the optimizer in backward,
FSDP2 sharding; the optimizer), the step (``step``: forward, loss, backward, clip, AdamW; the
schedule and the seeded clip order), where its clips come from (``sources``: a dataset streamed
or held in memory; ``online``: a policy filling a ring while the model trains), the run
directory and what a resume may change (``run_directory``), checkpoints, data-parallel ranks
(``distributed``), ``metrics.jsonl`` and the loss curve (``metrics``), and the loggers. ``swm
memprofile`` traces this very step (``memory.predict``).
"""
