"""A whole run: its config (TOML + ``--set``), its plan (specs, validation, addresses),
training, recovery, the run directory, progress, summary, evaluation and deployment."""
