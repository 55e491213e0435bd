"""The Slurm hand-off: slurm.conf from the inventory (`provisiond slurm config`) and the
power saving programs (`provisiond slurm resume|suspend`)."""
