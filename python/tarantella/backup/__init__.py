"""BackupAndRestore on many ranks, and the exact resume of fit from its
backup, also in mid-epoch.

Users pass keras.callbacks.BackupAndRestore to fit as they would to Keras;
callbacks.distribute runs a DistributedBackupAndRestore made from it in its
place (distributed(): a user's subclass keeps its own methods). Keras's
BackupAndRestore restores the weights and the optimizer state and starts fit
again at the beginning of the epoch in which the backup was taken. Under
Tarantella a resumed fit goes on where the backup was taken, as if it had
never stopped; with the same number of ranks it computes exactly what the
uninterrupted run computes, so its weights are bitwise the same.

* callback.py  DistributedBackupAndRestore: writes a backup atomically from
               the master (a pipeline's stages write their own weights),
               restores it on every rank
* files.py     the backup's weights files: which rank writes and restores
               which, their values (variables_snapshot), the files that a
               backup's metadata names
* state.py     what a weights file leaves out: every rank's random seeds and
               metric accumulators, the callbacks' state from epoch to epoch
* position.py  the place in the data: the iterators a resumed fit makes
               again, the batches of its first epoch that it goes past
"""
from tarantella.backup.callback import DistributedBackupAndRestore
from tarantella.backup.callback import distributed

__all__ = ["DistributedBackupAndRestore", "distributed"]
