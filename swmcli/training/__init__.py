"""Training, under the commands: the step (``step``: forward, loss, backward, clip, AdamW; the
schedule and the seeded clip order), where its clips come from (``sources``: a dataset streamed
or held in memory; ``online``: a policy filling a ring while the model trains), checkpoints,
data-parallel ranks (``distributed``), ``metrics.jsonl`` and the loss curve (``metrics``), and
the loggers. ``swm memprofile`` traces this very step (``memory.predict``).
"""
