"""Cells together and grouped cells: every decision about several cells in one process, and the grouped model.

Two words, each for one thing:

- *together*: cells that share a worker's process (``flctl.train.train_together``, ``--batch-runs K``);
- *grouped*: cells together that train as one grouped model, one launch per op for all of them. Cells together
  that are not grouped step one by one, interleaved, each with its own RNG streams.

By job:

- ``policy`` (torch-free, read by the CLI and the launch): how many cells a worker takes (``cells_together``), which
  cells may share a process (``can_train_together``), and whether cells together become one grouped model as far as
  their configuration and task say (``groups_on``; the model's layers have the last word, ``model.groupable``);
- ``model``: K models of one architecture as one grouped model (``Grouped``), each cell's tensors views of its row;
- ``rows``: owners' tensors made rows of one tensor (``side_by_side``), which the model, methods and batches share;
- ``methods``: the update rules of a method class's cells as one (``group_methods``);
- ``optim``: their AdamW or SGD steps as one (``grouped_optimizer``);
- ``step``: the group's batches (``GroupBatches``) and its step (``grouped_step``);
- ``evaluate``: the group's evaluations through one forward (``evaluate_together``).

This file imports nothing, so that ``flctl.grouped.policy`` stays torch-free.
"""
